"""draftsmith: train speculative-decoding drafters for a frozen target LLM, measure what they are worth, export them
for vLLM and SGLang, and run them in a lossless decoder. The command line is `draftsmith` (draftsmith.cli);
the parts are draftsmith.serve (decoding, drafters, exports, server), .data, .train, .eval and .configs."""

"""The data pipeline: prompts -> the target's own answers with assistant-only loss masks -> hidden-state cache
-> draft vocabulary.

    data.prompts   load_prompts(source) -> [PromptRow(id, domain, messages)]   (JSONL, HF datasets, builtin)
    data.builtin   the project's own prompt sets, BUILTIN_DOMAINS
    data.masks     render_with_mask(tokenizer, messages) -> (input_ids, loss_mask), from the target's template
    data.build     build_dataset(target, DataBuildConfig, out_dir=...)        `draftsmith data build`
    data.capture   capture_hidden_states(...), CacheReader                    `draftsmith data capture`
    data.vocab     select_draft_vocab(dataset, vocab_size, draft_vocab_size) -> (d2t, t2d, coverage)
"""

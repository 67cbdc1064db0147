"""The runtime's core, what every package of draftsmith stands on: target loading and its config section, config
merging, errors, files, threads, measured costs, the KV cache's rollback, the hidden-state layer convention, prompt
encoding, sampling and the traffic folder the server records. It imports nothing else of draftsmith; data/, train/,
eval/ and the rest of serve/ import it."""

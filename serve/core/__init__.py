"""The runtime's core, what every package of draftsmith stands on: target loading and its config section, config
merging, errors, files, threads, measured costs, the KV cache's rollback, the hidden-state layer convention, prompt
encoding, sampling, the traffic folder the server records, and a target split over the processes of a launch with
its memory plan. It imports nothing else of draftsmith; data/, train/, eval/ and the rest of serve/ import it."""

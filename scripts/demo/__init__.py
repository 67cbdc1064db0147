"""The demo: the main job end to end on an embedded target (`draftsmith demo`), and what only it uses: the
machine probe that picks its dtype and threads (machine.py), its stages sized to a budget (budget.py), kept to it
as they run (pacer.py) and resumed from what they spent (ledger.py). run.py drives the stages."""

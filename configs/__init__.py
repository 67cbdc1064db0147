"""The built-in recipes (`<target>/<method>.yaml`, demo/, data/, debug/) and the launch templates (accelerate/,
deepspeed/), shipped as package data so an installed draftsmith finds them by name: `--config smollm2-135m/eagle3`
(serve/core/recipes.py). No code lives here."""

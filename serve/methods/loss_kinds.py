"""The losses against the target's distribution a recipe can pick (`loss.kind`), named without importing torch (the
recipe checks read them); their maths is serve/methods/losses.py `distribution_loss`."""
from __future__ import annotations

# soft cross-entropy (KL up to the target's entropy), and three that train for acceptance alpha = sum_v min(p_v, q_v),
# as speculators' losses/eager.py and SpecForge's core/lk_loss.py define them
DISTRIBUTION_LOSSES = {
    "ce": "soft cross-entropy -sum_v p log q",
    "tv": "total variation 1 - alpha",
    "nla": "negative log-acceptance -log alpha",
    "lk_hybrid": "lam * KL(p||q) + (1 - lam)(1 - alpha), lam = exp(-loss.lk_eta * alpha)",
}

# how the drafted positions of one chain or block are weighed (`loss.position_weighting`)
POSITION_WEIGHTINGS = {
    "decay": "loss.decay^i for position i, fixed",
    "dpace": "D-PACE: each position's share of the smoothed expected accepted length, from the draft's own acceptance",
}

"""The paper's learning-rate schedule (section 5.3):

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

linear warm-up for `warmup_steps` updates, then decay with the inverse square root of the step.
`scale` multiplies the whole formula (1.0 in the paper). Steps count from 1.
"""

from __future__ import annotations


def rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

"""Calibration: choosing a checkpoint's Seer and DyLLM settings from requests with their baseline
answers (``seer``: probe layer, threshold and SNR test; ``dyllm``: tau and the attention mode).
Algorithms only; the ``seer calibrate`` commands that read inputs and write JSON live in ``cli``."""

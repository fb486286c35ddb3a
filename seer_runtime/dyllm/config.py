"""DyLLM's settings (:class:`DyLLMConfig`): by default what its authors' code runs
(younjoo0614/DyLLM 6487a59: ``dyllm/engine/model_runner.py``, ``layers/attention.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import StoredConfig, check_bool, check_int, warn_caller

#: tau when ``DyLLMConfig.tau`` is None, per model family (the paper's defaults)
DEFAULT_TAU = {"llada": 0.99, "dream": 0.995}


@dataclass(frozen=True)
class DyLLMConfig(StoredConfig):
    """DyLLM's settings; validated on construction. The defaults are the authors' code's.

    tau: cosine-similarity threshold, a row is salient when ``cos < tau``; None -> the family
        default (0.99 LLaDA, MMaDA, LaViDa-LLaDA; 0.995 Dream, LaViDa-Dream). ``tau > 1``
        makes every row salient (sparse steps then compute what dense steps compute; said by a
        UserWarning, since a typo for 0.x would otherwise silently cost all the savings).
    full_steps: warm-up steps computed in full (>= 1: the caches must be filled first).
    prompt_period: without a prefix cache, a sparse step ``t`` (0-based) feeds the prompt when
        ``(t + 1) % prompt_period == 0`` or ``t < prompt_period`` and only the window otherwise
        (1: always fed) - the authors' phase: with the 1-based step count ``n = t + 1`` their
        model runner feeds the window alone when ``n > 4 and n % 4 != 0`` (both 4s literal; read
        here as the period), so with 4 full steps t = 7, 11, 15, ... feed the prompt, and with
        fewer full steps so do the sparse steps of the first period.
    approx_attention: True (the default) approximates the rows outside the gating set from
        their cached context and the salient columns only (``partial_attention``); False gives
        every fed query row exact attention.
    key_correction: with ``approx_attention``, False (the default) is the authors' update
        ``C_cache + P_new[:, A] @ dV`` (the change of the gating rows' values only); True is our
        change, which also accounts for the change of their keys (``partial_attention(...,
        k_old=...)``, the same ``O(N |A| d)`` cost; exact when nothing else changed):
        opt-in, and chosen by ``seer calibrate-dyllm`` only where it keeps more answers.
    """

    tau: float | None = None
    full_steps: int = 4
    prompt_period: int = 4
    approx_attention: bool = True
    key_correction: bool = False

    def __post_init__(self) -> None:
        if self.tau is not None:
            if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)):
                raise TypeError(f"tau must be a real number or None, got {type(self.tau).__name__}")
            if not math.isfinite(self.tau) or self.tau <= 0:
                raise ValueError(f"tau must be a finite number > 0 (a cosine-similarity threshold), got {self.tau!r}")
            object.__setattr__(self, "tau", float(self.tau))
            if self.tau > 1:  # a deliberate setting (the exactness check), but a typo for 0.x must not pass unsaid
                warn_caller(f"DyLLMConfig(tau={self.tau}): a cosine similarity is never above 1, so every row is "
                              "salient at every layer: DyLLM then computes what the baseline computes (token for "
                              "token the same output, no saving)", UserWarning)
        for name in ("full_steps", "prompt_period"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("approx_attention", "key_correction"):
            check_bool(name, getattr(self, name))

    @property
    def attention_mode(self) -> str:
        """``"paper"`` (the authors' partial attention, the default), ``"partial"`` (ours,
        key-corrected) or ``"exact"``."""
        if not self.approx_attention:
            return "exact"
        return "partial" if self.key_correction else "paper"

    def tau_for(self, family: str) -> float:
        """The threshold in force for a model ``family`` ("llada" or "dream")."""
        if self.tau is not None:
            return self.tau
        if family not in DEFAULT_TAU:
            raise ValueError(f"no default tau for model family {family!r}; set tau explicitly")
        return DEFAULT_TAU[family]

    @classmethod
    def for_model(cls, model, **changes) -> DyLLMConfig:
        """The authors' settings for ``model``'s family (its tau filled in; ``changes`` override)."""
        family = getattr(model, "family", None)
        if family not in DEFAULT_TAU:
            raise ValueError(f"model family {family!r} has no DyLLM default (known: {sorted(DEFAULT_TAU)})")
        return cls(**{"tau": DEFAULT_TAU[family], **changes})

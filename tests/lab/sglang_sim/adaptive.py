"""Adaptive speculative decoding as SGLang 0.5.23 runs it (srt/speculative/adaptive_spec_params.py).

`--speculative-adaptive` switches --speculative-num-steps at run time: one slot per batch-size key of the config,
each an EMA of the accepted draft tokens per request, updated after every verify; after a warm-up and then every
`update_interval` verifies the slot moves its steps down or up its sorted candidate list by thresholds on that EMA
(with hysteresis). The running batch is padded to the CUDA-graph batch sizes and routed to the closest key at or
below it. Every candidate's runtime state is built at start, so a switch costs no time at run time
(srt/speculative/adaptive_runtime_state.py). tests/lab/README.md cites the lines.
"""

from __future__ import annotations

import bisect
import json
import math

DEFAULT_ADAPTIVE_CONFIG: dict = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def unsupported_reason(
    algorithm: str | None,
    eagle_topk: int | None,
    *,
    attn_dp_size: int = 1,
    enable_multi_layer_eagle: bool = False,
    enable_two_batch_overlap: bool = False,
    enable_pdmux: bool = False,
) -> str | None:
    """adaptive_unsupported_reason: why adaptive cannot run with these arguments, or None (its messages)."""
    if algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if eagle_topk is not None and eagle_topk != 1:
        return f"speculative_eagle_topk={eagle_topk} (only topk=1 is supported)"
    if attn_dp_size > 1:
        return "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    if enable_multi_layer_eagle:
        return "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    if enable_two_batch_overlap:
        return (
            "enable_two_batch_overlap=True is not supported "
            "(adaptive state swap would discard the TboAttnBackend wrapper)"
        )
    if enable_pdmux:
        return "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    return None


def load_config(path: str | None) -> tuple[dict, dict[int, dict]]:
    """_load_adaptive_config: the whole config and its batch-size entries; ValueError with SGLang's message.

    Keys that are not digit strings are skipped (top-level knobs shared by every entry); a file that is not JSON
    raises json.JSONDecodeError, as json.load does in SGLang.
    """
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            cfg = json.load(handle)
    else:
        cfg = DEFAULT_ADAPTIVE_CONFIG
    entries: dict[int, dict] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        entries[int(key)] = entry
    if not entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string "
            'BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(cfg.keys())}"
        )
    return cfg, entries


def candidate_steps_of(path: str | None) -> list[int]:
    """resolve_candidate_steps_from_config: the union of every entry's candidate steps."""
    _knobs, entries = load_config(path)
    return sorted({step for entry in entries.values() for step in entry["candidate_steps"]})


def decode_cuda_graph_bs(max_bs: int) -> list[int]:
    """generate_decode_cuda_graph_batch_sizes for speculative decoding (srt/arg_groups/cuda_graph_hook.py)."""
    sizes = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
    sizes += list(range(272, max_bs + 1, 16))
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


class StepSlot:
    """AdaptiveStepSlot: the EMA of accepted drafts per request and the steps it chooses."""

    def __init__(self, initial_steps: int, cfg: dict):
        self.candidate_steps = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = cfg.get("ema_alpha", 0.2)
        self.update_interval = cfg.get("update_interval", 5)
        self.warmup_batches = cfg.get("warmup_batches", 10)
        self.down_hysteresis = cfg.get("down_hysteresis", -0.25)
        self.up_hysteresis = cfg.get("up_hysteresis", 0.0)
        self.ceiling_coeff = cfg.get("ceiling_coeff", 0)
        if initial_steps in self.candidate_steps:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        self.ema_accept_len = float(self.current_steps - 1)
        self.batch_count = 0

    def update(self, batch_avg_correct: float) -> bool:
        """One verify's mean accepted drafts per request; True when the steps changed."""
        if self.current_steps > 0:
            self.ema_accept_len = (1 - self.ema_alpha) * self.ema_accept_len + self.ema_alpha * batch_avg_correct
        self.batch_count += 1
        if self.batch_count <= self.warmup_batches:
            return False
        if (self.batch_count - self.warmup_batches) % self.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        old = self.current_steps
        index = self.candidate_steps.index(old)
        old_index = index
        if old == 0:
            index = min(index + 1, len(self.candidate_steps) - 1)
            target = self.candidate_steps[index]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply(old, target)
        while index > 0:
            previous = self.candidate_steps[index - 1]
            threshold = (0.5 if previous == 0 else previous - 0.5) + self.down_hysteresis
            if self.ema_accept_len <= threshold:
                index -= 1
            else:
                break
        if index >= old_index:
            while index < len(self.candidate_steps) - 1:
                if self.ema_accept_len > self.candidate_steps[index] - 0.5 + self.up_hysteresis:
                    index += 1
                else:
                    break
        target = self.candidate_steps[index]
        if self.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema_accept_len * self.ceiling_coeff))
            if ceiling < target <= old:
                while index > 0 and self.candidate_steps[index] > ceiling:
                    index -= 1
                target = self.candidate_steps[index]
        return self._apply(old, target)

    def _apply(self, old: int, target: int) -> bool:
        self.current_steps = target
        return target != old


class AdaptiveParams:
    """AdaptiveSpeculativeParams: one slot per batch-size key; a batch is padded to the CUDA-graph sizes and routed
    to the closest key at or below it (the smallest key when below all)."""

    def __init__(self, initial_steps: int, path: str | None, cuda_graph_bs: list[int] | None):
        cfg, entries = load_config(path)
        self.keys = sorted(entries)
        self.slots = {bs: StepSlot(initial_steps, {**cfg, **entries[bs]}) for bs in self.keys}
        self.cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None
        self.switches = 0

    def route(self, batch_size: int) -> StepSlot:
        padded = batch_size
        if self.cuda_graph_bs is not None:
            index = bisect.bisect_left(self.cuda_graph_bs, batch_size)
            padded = self.cuda_graph_bs[index] if index < len(self.cuda_graph_bs) else batch_size
        index = bisect.bisect_right(self.keys, padded) - 1
        return self.slots[self.keys[max(0, index)]]

    def steps_for_batch(self, batch_size: int) -> int:
        return self.route(batch_size).current_steps

    def on_verify_complete(self, batch_avg_correct: float, batch_size: int) -> int | None:
        slot = self.route(batch_size)
        if slot.update(batch_avg_correct):
            self.switches += 1
            return slot.current_steps
        return None

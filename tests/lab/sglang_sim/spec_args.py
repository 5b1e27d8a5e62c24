"""Resolve the --speculative-* flags as SGLang 0.5.23 does (srt/arg_groups/speculative_hook.py).

Only the rules an operator meets are mirrored: the algorithm name must be a member of the installed
SpeculativeAlgorithm enum (NEXTN is an alias of EAGLE), SGLang's automatic (steps, top-k, draft
tokens) choice, the per-family defaults, and draft tokens forced to steps + 1 when top-k is 1; with
--speculative-adaptive, adaptive_unsupported_reason turning it off with a warning, the config loaded and checked
at start, and the initial steps taken from (and required in) the config's candidate steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import adaptive as adaptive_mod

BLOCK_DRAFT_ALGORITHMS = ("DFLASH", "DSPARK")
DFLASH_DEFAULT_DRAFT_TOKENS = 16
DSPARK_DEFAULT_DRAFT_TOKENS = 8
NGRAM_MAX_BFS_BREADTH = 10
NGRAM_DEFAULT_DRAFT_TOKENS = 12
LLAMA_LIKE_AUTO = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")


@dataclass(frozen=True)
class SpecConfig:
    algorithm: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    warnings: tuple[str, ...] = field(default=())
    adaptive: bool = False
    adaptive_config: str | None = None
    candidate_steps: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None


def _check_positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{flag} must be a positive integer, got {value}.")


def resolve(
    algorithm: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    *,
    members: frozenset[str],
    aliases: frozenset[str],
    model_arch: str | None = None,
    adaptive: AdaptiveFlags | None = None,
) -> SpecConfig:
    """Return the resolved speculative settings, or raise ValueError with SGLang's message."""
    if algorithm is None:
        warnings = _adaptive_disabled(adaptive, None, eagle_topk)
        return SpecConfig(None, num_steps, eagle_topk, num_draft_tokens, tuple(warnings))
    upper = algorithm.upper()
    if upper in members:
        name = upper
    elif upper in aliases:
        name = "EAGLE"
    else:
        raise ValueError(f"Unknown speculative algorithm name: {algorithm}")
    if name == "NEXTN":
        name = "EAGLE"
    if name == "NONE":
        warnings = _adaptive_disabled(adaptive, None, eagle_topk)
        return SpecConfig(None, num_steps, eagle_topk, num_draft_tokens, tuple(warnings))
    _check_positive("--speculative-num-steps", num_steps)
    _check_positive("--speculative-eagle-topk", eagle_topk)
    _check_positive("--speculative-num-draft-tokens", num_draft_tokens)
    warnings = [
        "Max running requests is reset to 48 for speculative decoding. "
        "You can override this by explicitly setting --max-running-requests."
    ]
    disabled = _adaptive_disabled(adaptive, name, eagle_topk)
    warnings.extend(disabled)
    if adaptive is not None and adaptive.enabled and not disabled:
        return _adaptive(name, num_steps, eagle_topk, num_draft_tokens, adaptive, model_arch, warnings)
    if name in BLOCK_DRAFT_ALGORITHMS:
        return _block_draft(name, num_steps, eagle_topk, num_draft_tokens, warnings)
    if name == "NGRAM":
        return _ngram(num_steps, num_draft_tokens, warnings)
    return _eagle_family(name, num_steps, eagle_topk, num_draft_tokens, model_arch=model_arch, warnings=warnings)


@dataclass(frozen=True)
class AdaptiveFlags:
    """--speculative-adaptive, --speculative-adaptive-config and the flags adaptive_unsupported_reason reads."""

    enabled: bool = False
    config: str | None = None
    attn_dp_size: int = 1
    enable_multi_layer_eagle: bool = False
    enable_two_batch_overlap: bool = False
    enable_pdmux: bool = False


def _adaptive_disabled(flags: AdaptiveFlags | None, name: str | None, topk: int | None) -> list[str]:
    """_maybe_disable_adaptive: SGLang does not refuse to start, it warns and serves the static settings."""
    if flags is None or not flags.enabled:
        return []
    reason = adaptive_mod.unsupported_reason(
        name,
        topk,
        attn_dp_size=flags.attn_dp_size,
        enable_multi_layer_eagle=flags.enable_multi_layer_eagle,
        enable_two_batch_overlap=flags.enable_two_batch_overlap,
        enable_pdmux=flags.enable_pdmux,
    )
    if reason is None:
        return []
    return [f"speculative_adaptive disabled: {reason}. Falling back to static speculative params."]


def _adaptive(
    name: str,
    steps: int | None,
    topk: int | None,
    draft: int | None,
    flags: AdaptiveFlags,
    model_arch: str | None,
    warnings: list[str],
) -> SpecConfig:
    """_init_adaptive_speculative_params: load the config (its errors stop the start), top-k 1, the initial steps
    the middle of the candidates unless given (and then one of them), draft tokens steps + 1."""
    candidates = adaptive_mod.candidate_steps_of(flags.config)
    topk = 1 if topk is None else topk
    if steps is None:
        steps = candidates[len(candidates) // 2]
    if steps not in candidates:
        raise ValueError(
            f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps {candidates}. "
            "Pass one of those values."
        )
    resolved = _eagle_family(name, steps, topk, steps + 1, model_arch=model_arch, warnings=warnings)
    return SpecConfig(
        resolved.algorithm,
        resolved.num_steps,
        resolved.eagle_topk,
        resolved.num_draft_tokens,
        resolved.warnings,
        adaptive=True,
        adaptive_config=flags.config,
        candidate_steps=tuple(candidates),
    )


def _block_draft(name: str, steps: int | None, topk: int | None, draft: int | None, warnings: list[str]) -> SpecConfig:
    label = "DFLASH" if name == "DFLASH" else "DSpark"
    if steps not in (None, 1):
        warnings.append(
            f"{label} only supports speculative_num_steps == 1; overriding speculative_num_steps={steps} to 1."
        )
    if topk not in (None, 1):
        warnings.append(
            f"{label} only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk={topk} to 1."
        )
    if draft is None:
        draft = DFLASH_DEFAULT_DRAFT_TOKENS if name == "DFLASH" else DSPARK_DEFAULT_DRAFT_TOKENS
        warnings.append(f"speculative_num_draft_tokens is not set; defaulting to {draft} for {name}.")
    if name == "DSPARK" and draft < 2:
        raise ValueError(f"DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got {draft}.")
    return SpecConfig(name, 1, 1, draft, tuple(warnings))


def _ngram(steps: int | None, draft: int | None, warnings: list[str]) -> SpecConfig:
    topk = NGRAM_MAX_BFS_BREADTH
    if draft is None:
        draft = NGRAM_DEFAULT_DRAFT_TOKENS
        warnings.append(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens."
        )
    if steps is None:
        steps = max(1, draft // topk)
    return SpecConfig("NGRAM", steps, topk, draft, tuple(warnings))


def auto_params(name: str, model_arch: str | None) -> tuple[int, int, int]:
    """SGLang's _auto_choose_speculative_params."""
    if name == "STANDALONE":
        return (3, 1, 4)
    if model_arch in LLAMA_LIKE_AUTO:
        return (5, 4, 8)
    return (3, 1, 4)


def _eagle_family(
    name: str, steps: int | None, topk: int | None, draft: int | None, *, model_arch: str | None, warnings: list[str]
) -> SpecConfig:
    if steps is None:
        if topk is not None or draft is not None:
            raise ValueError(
                "--speculative-eagle-topk and --speculative-num-draft-tokens need --speculative-num-steps: "
                "SGLang chooses all three itself only when none is set (it asserts this)."
            )
        steps, topk, draft = auto_params(name, model_arch)
    if topk is None:
        raise ValueError(
            "--speculative-num-steps is set but --speculative-eagle-topk is not; SGLang 0.5.23 fails here with "
            "TypeError: '>' not supported between instances of 'NoneType' and 'int'. Set --speculative-eagle-topk."
        )
    if topk == 1 and draft != steps + 1:
        warnings.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
        )
        draft = steps + 1
    if draft is None:
        raise ValueError("--speculative-num-draft-tokens is required when --speculative-eagle-topk > 1.")
    return SpecConfig(name, steps, topk, draft, tuple(warnings))

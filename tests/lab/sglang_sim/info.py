"""Bodies of /model_info, /server_info and /v1/models, shaped as SGLang 0.5.23's."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONTEXT_LENGTH = 32768


@dataclass(frozen=True)
class ModelConfig:
    architectures: list | None
    model_type: str | None
    context_len: int


def read_model_config(model_path: str, context_length: int | None) -> ModelConfig:
    """config.json of a local model directory when there is one; a Hugging Face id needs no files here."""
    config: dict = {}
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        config = {}
    length = context_length or config.get("max_position_embeddings") or DEFAULT_CONTEXT_LENGTH
    return ModelConfig(config.get("architectures"), config.get("model_type"), int(length))


def model_info(ns, model: ModelConfig) -> dict:
    return {
        "model_path": ns.model_path,
        "served_model_name": ns.served_model_name,
        "tokenizer_path": ns.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": model.model_type,
        "architectures": model.architectures,
    }


def server_args(ns, spec, model: ModelConfig) -> dict:
    """The resolved server arguments (the subset the simulator models)."""
    return {
        "model_path": ns.model_path,
        "tokenizer_path": ns.tokenizer_path,
        "tokenizer_mode": "auto",
        "trust_remote_code": ns.trust_remote_code,
        "context_length": model.context_len,
        "served_model_name": ns.served_model_name,
        "host": ns.host,
        "port": ns.port,
        "api_key": ns.api_key,
        "mem_fraction_static": ns.mem_fraction_static,
        "max_running_requests": ns.max_running_requests or (48 if spec.enabled else 2048),
        "tp_size": ns.tp_size,
        "dp_size": ns.dp_size,
        "pp_size": ns.pp_size,
        "base_gpu_id": ns.base_gpu_id,
        "gpu_id_step": ns.gpu_id_step,
        "device": "cuda",
        "random_seed": ns.random_seed,
        "log_level": ns.log_level,
        "enable_metrics": ns.enable_metrics,
        "stream_interval": ns.stream_interval,
        "incremental_streaming_output": ns.incremental_streaming_output,
        "skip_server_warmup": ns.skip_server_warmup,
        "speculative_algorithm": spec.algorithm,
        "speculative_draft_model_path": ns.speculative_draft_model_path,
        "speculative_draft_model_revision": "main" if ns.speculative_draft_model_path else None,
        "speculative_num_steps": spec.num_steps,
        "speculative_eagle_topk": spec.eagle_topk,
        "speculative_num_draft_tokens": spec.num_draft_tokens,
        "speculative_adaptive": spec.adaptive,
        "speculative_adaptive_config": spec.adaptive_config,
        "speculative_accept_threshold_single": 1.0,
        "speculative_accept_threshold_acc": 1.0,
        "speculative_attention_mode": "prefill",
        "enable_dp_attention": False,
    }


def server_info(
    args: dict, *, launch_command: str, startup_time: float, scheduler_info: dict, internal_states: list, version: str
) -> dict:
    return {
        **args,
        "launch_command": launch_command,
        **scheduler_info,
        "kv_events": None,
        "startup_time": startup_time,
        "internal_states": internal_states,
        "version": version,
        "frontend": "python",
    }


def internal_state(
    args: dict, ns, *, startup_time: float, last_gen_throughput: float, memory: dict, avg_accept_length: float | None
) -> dict:
    state = dict(args)
    state.update(
        {
            "world_size": ns.tp_size * ns.dp_size,
            "startup_time": startup_time,
            "effective_max_running_requests_per_dp": args["max_running_requests"],
            "last_gen_throughput": last_gen_throughput,
            "memory_usage": memory,
        }
    )
    if avg_accept_length is not None:
        state["avg_spec_accept_length"] = avg_accept_length
    return state


def memory_usage(weight_mib: int, kv_mib: int, graph_mib: int, startup_available_mib: int, token_capacity: int) -> dict:
    def gib(mib: int) -> float:
        return round(mib / 1024, 3)

    return {
        "weight": gib(weight_mib),
        "kvcache": gib(kv_mib),
        "startup_available": gib(startup_available_mib),
        "token_capacity": int(token_capacity),
        "token_capacity_swa": None,
        "graph": {"decode": gib(graph_mib)},
    }


def model_list(ns, model: ModelConfig, created: int | None = None) -> dict:
    return {"object": "list", "data": [model_card(ns.served_model_name, model, created)]}


def model_card(name: str, model: ModelConfig, created: int | None = None) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": int(created or time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": model.context_len,
    }

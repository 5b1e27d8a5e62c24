"""/v1/chat/completions and /v1/completions on top of the engine, shaped as SGLang's OpenAI server answers."""

from __future__ import annotations

import time
from typing import Callable

from .engine import GenerationError, Sampling, new_request, parse_sampling


def chat_prompt(messages) -> str:
    """A chat template good enough to count tokens and seed the text."""
    if not isinstance(messages, list) or not messages:
        raise GenerationError("messages must be a non-empty list.")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise GenerationError("each message needs a role and content.")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{message['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def _sampling(body: dict) -> Sampling:
    params = {
        "max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
        "temperature": body.get("temperature"),
        "stop": body.get("stop"),
    }
    return parse_sampling(params)


def _finish(meta: dict) -> tuple[str | None, str | None]:
    reason = meta.get("finish_reason")
    if not reason:
        return None, None
    return reason.get("type"), reason.get("matched") if reason.get("type") == "stop" else None


def _usage(meta: dict) -> dict:
    return {
        "prompt_tokens": meta["prompt_tokens"],
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        "completion_tokens": meta["completion_tokens"],
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _check_n(body: dict) -> None:
    if body.get("n", 1) not in (1, None):
        raise GenerationError("The simulated server supports n=1 only.")


def complete(runner, body: dict, served_model: str, chat: bool, send: Callable[[dict], None] | None, client_gone=None):
    """Answer one request; with `send` (streaming) every chunk goes through it and None is returned."""
    _check_n(body)
    if chat:
        prompt = chat_prompt(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        if not isinstance(prompt, str):
            raise GenerationError("prompt must be a string.")
    request = new_request(prompt, None, _sampling(body), send is not None, body.get("rid"))
    model = body.get("model") or served_model
    created = int(time.time())
    kind = "chat.completion" if chat else "text_completion"
    if send is None:
        out = runner.generate(request, client_gone=client_gone)
        meta = out["meta_info"]
        reason, matched = _finish(meta)
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": out["text"], "reasoning_content": None, "tool_calls": None},
                "logprobs": None,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        else:
            choice = {
                "index": 0,
                "text": out["text"],
                "logprobs": None,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        return {
            "id": meta["id"],
            "object": kind,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(meta),
            "metadata": {"weight_version": meta["weight_version"]},
        }
    _stream(runner, request, body, model=model, created=created, chat=chat, send=send, client_gone=client_gone)
    return None


def _stream(runner, request, body: dict, *, model: str, created: int, chat: bool, send, client_gone) -> None:
    kind = "chat.completion.chunk" if chat else "text_completion"
    incremental = runner.config.incremental_streaming
    sent = {"length": 0}

    def chunk(text: str, reason=None, matched=None) -> dict:
        if chat:
            choice = {
                "index": 0,
                "delta": {"role": None, "content": text, "reasoning_content": None, "tool_calls": None},
                "logprobs": None,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
        return {
            "id": request.rid,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": None,
        }

    def delta(out: dict) -> str:
        if incremental:
            return out["text"]
        text = out["text"][sent["length"] :]
        sent["length"] = len(out["text"])
        return text

    runner.validate(request)
    if chat:
        first = chunk("")
        first["choices"][0]["delta"]["role"] = "assistant"
        send(first)
    final = runner.generate(request, lambda out: send(chunk(delta(out))), client_gone=client_gone)
    meta = final["meta_info"]
    reason, matched = _finish(meta)
    send(chunk(delta(final), reason, matched))
    options = body.get("stream_options") or {}
    if isinstance(options, dict) and options.get("include_usage"):
        send(
            {
                "id": request.rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(meta),
            }
        )

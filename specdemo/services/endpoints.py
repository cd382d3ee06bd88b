"""Race lanes served by an OpenAI-compatible server: llama.cpp's llama-server, vLLM, SGLang, LM Studio.

A lane streams ``/v1/chat/completions`` (or ``/v1/completions``) with httpx and turns the stream
into the same :class:`~specdemo.core.engine.DecodeEvent` objects our engine yields, so the race, the
command line and the page treat both kinds of lane alike:

- ``ttft_s`` and ``elapsed_s`` are measured here, from sending the request to the first / last
  streamed chunk with text (network and server queueing included, as a user sees it);
- ``new_tokens`` and ``prompt_tokens`` come from the server's ``usage`` (``stream_options:
  {"include_usage": true}``); while streaming, ``new_tokens`` is llama-server's own
  ``timings.predicted_n`` when it sends it per chunk, else the number of chunks with text so far
  (replaced by ``usage`` on the last event);
- drafted / accepted and the rest come from where each engine reports them (the ``*_stats``
  functions below). A counter the engine does not report is None and its name is listed in
  ``stats.not_reported``; nothing is estimated.

Engines (read from their sources or documentation, 2026-12):

- llama.cpp ``llama-server``: ``timings`` in the last chunk (``draft_n``, ``draft_n_accepted``,
  present only when the slot drafted, ``prompt_ms``, ``predicted_ms``); ``owned_by: "llamacpp"``
  in ``/v1/models``. On ``/v1/completions`` with ``"verbose": true`` every chunk carries the
  generated token ids (``__verbose.tokens``).
- vLLM: Prometheus counters ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``,
  ``_num_accepted_tokens``, ``_num_accepted_tokens_per_pos`` on ``/metrics``, read just before and
  just after the lane's request (deltas are right only when nothing else runs on that server).
- SGLang: ``meta_info.spec_verify_ct`` (verification forwards) and ``spec_accept_length``.
- LM Studio: ``stats.total_draft_tokens_count``, ``accepted_draft_tokens_count``,
  ``rejected_draft_tokens_count``.

Safety: an endpoint that is not this machine (127.0.0.1, localhost, ::1) is refused unless the
caller allows it; the API key is read from an environment variable named by the user and never
printed, logged or put in an error message.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlsplit, urlunsplit

from ..checks import inputs
from ..checks.inputs import checked
from ..core.stats import DecodeStats

if TYPE_CHECKING:  # torch loads with the engine: only when a lane runs, not for --help
    from ..core.engine import DecodeEvent

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
APIS = ("chat", "completions")

# Counters our engine fills that no server reports per request.
ALWAYS_NOT_REPORTED = ("draft_s", "verify_s", "draft_length", "drafted_by", "accepted_by",
                       "draft_length_sum", "draft_length_min", "draft_length_max",
                       "extra_memory_bytes", "other_cpu_share")
NOT_REPORTED_TEXT = "not reported by this engine"


class EndpointError(ValueError):
    """A lane's server cannot be used or failed; the message is one sentence for the user."""


class BadField(EndpointError):
    """A value of the wrong type (or out of range) in a server's answer.

    The message names the field and says what came and what belongs there, e.g. ``a string
    ('7') for timings.draft_n, where a whole number of 0 or more belongs``; the stream puts the
    server in front of it (``the server at URL sent ...``).
    """

    def __init__(self, field: str, value, kind: str) -> None:
        self.field, self.value, self.kind = field, value, kind
        super().__init__(f"{_type_word(value)} ({_short(value)}) for {field}, where {kind} belongs")


def _type_word(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(value, field: str, optional: bool = True) -> str | None:
    """A string field (None allowed when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise BadField(field, value, "a string")
    return value


def _count(value, field: str) -> int:
    """A whole number >= 0 (JSON may write it as 5.0)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer()) or value < 0):
        raise BadField(field, value, "a whole number of 0 or more")
    return int(value)


def _seconds_from_ms(value, field: str) -> float:
    """Milliseconds (a finite number >= 0) as seconds."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0):
        raise BadField(field, value, "a number of milliseconds of 0 or more")
    return float(value) / 1000.0


def _object(value, field: str, optional: bool = True) -> dict | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise BadField(field, value, "an object")
    return value


def check_timeout(value) -> float:
    """The endpoint timeout in seconds: a finite number above 0.

    Raises:
        EndpointError: anything else (0 would fail every connection as "refused", NaN inside the
            HTTP library).
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise EndpointError(f"endpoint timeout must be a number of seconds above 0, got {value!r}")
    return float(value)


# --- addresses ------------------------------------------------------------------------------

def shown_url(url: str) -> str:
    """``url`` without user:password and query (safe to print)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def base_url(url: str, allow_remote: bool = False) -> str:
    """The server's base URL without a trailing ``/`` or ``/v1``.

    Args:
        url: e.g. ``http://127.0.0.1:8080``, ``http://127.0.0.1:8080/v1/``.
        allow_remote: accept a host other than 127.0.0.1, localhost or ::1.
    Raises:
        EndpointError: not an http(s) URL, or a host off this machine without ``allow_remote``.
    """
    text = (url or "").strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(f"endpoint {shown_url(text) or repr(text)} is not an http:// or "
                            f"https:// URL (e.g. http://127.0.0.1:8080)")
    try:
        parts.port
    except ValueError:
        raise EndpointError(f"endpoint {shown_url(text)} has an invalid port") from None
    if not allow_remote and not is_local(parts.hostname):
        raise EndpointError(f"endpoint {shown_url(text)} is not on this machine (127.0.0.1, "
                            f"localhost or ::1): the prompt would leave it; pass "
                            f"--allow-remote-endpoint (page: tick 'allow remote endpoints') "
                            f"to allow it")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def is_local(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(env_var: str | None) -> str | None:
    """The key in environment variable ``env_var`` (None when no variable is named).

    Raises:
        EndpointError: the variable is named but not set (the message names the variable only).
    """
    if not env_var:
        return None
    value = os.environ.get(env_var)
    if not value:
        raise EndpointError(f"environment variable {env_var} (named by --endpoint-key-env) is "
                            f"not set or empty")
    return value


@dataclass
class Endpoint:
    """One server a lane streams from.

    Attributes:
        url: base URL (with or without ``/v1``); checked by :func:`base_url`.
        model: the model name to request; None = the first one ``/v1/models`` lists.
        key_env: name of the environment variable holding the API key (never the key itself).
        api: ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``, raw
            text prompt: the messages joined, no chat template).
        timeout_s: seconds to wait for the connection and for each chunk.
        allow_remote: accept a host off this machine.
    """

    url: str
    model: str | None = None
    key_env: str | None = None
    api: str = "chat"
    timeout_s: float = 60.0
    allow_remote: bool = False
    engine: str | None = field(default=None, init=False)  # found by :meth:`detect`
    listed_model: str | None = field(default=None, init=False)  # /v1/models' id, by detect
    served_file: str | None = field(default=None, init=False)  # llama-server's /props, by detect

    def __post_init__(self) -> None:
        self.url = base_url(self.url, self.allow_remote)
        if self.api not in APIS:
            raise EndpointError(f"endpoint API {self.api!r} is not one of {', '.join(APIS)}")
        self.timeout_s = check_timeout(self.timeout_s)
        api_key(self.key_env)  # a named variable that is not set is refused up front

    @property
    def label(self) -> str:
        return f"{self.engine or 'server'} at {shown_url(self.url)}"

    def headers(self) -> dict:
        key = api_key(self.key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def client(self):
        import httpx
        return httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                            headers=self.headers(), trust_env=False)

    def detect(self, client) -> None:
        """Ask ``/v1/models`` which engine serves and which model (when none was named), and
        llama-server's ``/props`` which model file it has loaded (``served_file``: its name
        ignores the model name a request gives).

        Raises:
            EndpointError: no connection, an HTTP error, or an answer that is not OpenAI's (a
                field of the wrong type is named).
        """
        if self.engine is not None and self.model:
            return
        data = _get_json(client, self.url + "/v1/models", self.url)
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise EndpointError(f"{shown_url(self.url)}/v1/models did not answer like an "
                                f"OpenAI-compatible server (no 'data' list)")
        with answer_of(self.url):
            owners, ids = set(), []
            for i, entry in enumerate(models):
                entry = _object(entry, f"/v1/models data[{i}]", optional=False)
                owners.add((_text(entry.get("owned_by"), f"/v1/models data[{i}].owned_by")
                            or "").lower())
                ids.append(_text(entry.get("id"), f"/v1/models data[{i}].id"))
            self.engine = engine_name(owners)
            if not self.model:
                if not ids or ids[0] is None:
                    raise EndpointError(f"the server at {shown_url(self.url)} lists no model; "
                                        f"name one with --endpoint-model")
                self.model = ids[0]
            self.listed_model = self.model
            if self.engine == "llama.cpp":
                self.served_file = _props_model(client, self.url)


def _props_model(client, url: str) -> str | None:
    """The file name of the model llama-server has loaded (``/props``' ``model_path``), or None
    when it does not say (an older server, a proxy in front of it)."""
    try:
        props = _get_json(client, url + "/props", url)
    except EndpointError:
        return None
    if not isinstance(props, dict):
        return None
    path = _text(props.get("model_path"), "/props model_path")
    return re.split(r"[\\/]", path)[-1] if path else None


class answer_of:
    """``with answer_of(url):`` turns a :class:`BadField` raised inside into one sentence that
    names the server: ``the server at URL sent a string ('7') for timings.draft_n, where ...``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> None:
        if isinstance(exc, BadField):
            raise EndpointError(f"the server at {shown_url(self.url)} sent {exc}") from None


def engine_name(owners: set[str]) -> str:
    """The engine from ``owned_by`` values of ``/v1/models``."""
    if "llamacpp" in owners:
        return "llama.cpp"
    if "vllm" in owners:
        return "vllm"
    if "sglang" in owners:
        return "sglang"
    if "organization_owner" in owners:  # LM Studio
        return "lmstudio"
    return "openai-compatible"


def _tls_error(exc: BaseException):
    """The ``ssl.SSLError`` under an httpx error, or None."""
    import ssl
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _describe_http(exc: Exception, url: str, during: str = "") -> str:
    import ssl

    import httpx
    where = shown_url(url)
    tls = _tls_error(exc)
    if tls is not None:
        if isinstance(tls, ssl.SSLCertVerificationError):
            return (f"the server at {where} answered https:// with a TLS certificate this machine "
                    f"does not trust ({getattr(tls, 'verify_message', None) or tls.reason})")
        return (f"could not make a TLS (https://) connection to {where}: the server did not "
                f"answer in TLS ({tls.reason or type(tls).__name__}); if it serves plain HTTP, "
                f"use http://")
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect to {where}: connection refused or host unreachable (is the server running?)"
    if isinstance(exc, httpx.TimeoutException):
        return f"the server at {where} did not answer in time{during}"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"the server at {where} closed the connection{during} (it stopped or crashed)"
    return f"the request to {where} failed{during}: {type(exc).__name__}"


def _get_json(client, url: str, base: str):
    import httpx
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise EndpointError(_describe_http(exc, base)) from None
    if response.status_code != 200:
        raise EndpointError(f"{shown_url(url)} answered HTTP {response.status_code}"
                            f"{_error_detail(response.text)}")
    try:
        return response.json()
    except ValueError:
        raise EndpointError(f"{shown_url(url)} did not answer with JSON: it is not an "
                            f"OpenAI-compatible server") from None


def _error_detail(body: str) -> str:
    try:
        err = json.loads(body).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    if not message:
        return ""
    return ": " + str(message).splitlines()[0][:200]


# --- request --------------------------------------------------------------------------------

def request_body(endpoint: Endpoint, messages: list[dict], settings, max_new_tokens: int | None = None) -> dict:
    """The JSON body for ``settings`` (:class:`specdemo.services.pipeline.DecodeSettings`), identical for
    both lanes apart from the model name. Sampling knobs outside OpenAI's API go by each engine's
    own name; an engine we do not know gets only OpenAI's.

    Raises:
        EndpointError: top-k or repetition penalty set for an engine we cannot pass them to.
    """
    body: dict = {"model": endpoint.model, "stream": True,
                  "stream_options": {"include_usage": True},
                  "max_tokens": max_new_tokens or settings.max_new_tokens,
                  "temperature": settings.temperature, "top_p": settings.top_p}
    if endpoint.api == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = "\n\n".join(m["content"] for m in messages)
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop_strings:
        body["stop"] = list(settings.stop_strings)
    engine = endpoint.engine
    if engine in ("llama.cpp", "lmstudio"):
        # llama.cpp's own defaults (top_k 40, min_p 0.05) would change the distribution at
        # temperature > 0: turn them off so both lanes sample from the same one.
        body.update(top_k=settings.top_k, min_p=0.0, repeat_penalty=settings.repetition_penalty)
        if engine == "llama.cpp":
            # timings on every chunk (its own token count while streaming); no prompt cache, so
            # that a repeated prompt is prefilled like the first (our engine caches nothing).
            body.update(timings_per_token=True, cache_prompt=False, return_tokens=True)
            if endpoint.api == "completions":
                body["verbose"] = True  # token ids in __verbose.tokens of every chunk
    elif engine in ("vllm", "sglang"):
        if settings.top_k:
            body["top_k"] = settings.top_k
        if settings.repetition_penalty != 1.0:
            body["repetition_penalty"] = settings.repetition_penalty
    elif settings.top_k or settings.repetition_penalty != 1.0:
        raise EndpointError(f"the server at {shown_url(endpoint.url)} is not one whose top-k / "
                            f"repetition penalty parameters we know; set top-k 0 and repetition "
                            f"penalty 1")
    return body


# --- each engine's statistics -----------------------------------------------------------------

def llama_cpp_stats(timings: dict) -> dict:
    """DecodeStats fields from llama-server's ``timings`` object.

    ``draft_n`` / ``draft_n_accepted`` are sent only when the slot drafted
    (``server_slot_stats::to_json``), so their absence means 0 drafted. llama-server does not
    report its verification forwards or per-position counts per request.

    Raises:
        BadField: a value that is not a count (``prompt_ms``: not milliseconds).
    """
    out: dict = {"drafted": _count(timings.get("draft_n", 0), "timings.draft_n"),
                 "accepted": _count(timings.get("draft_n_accepted", 0), "timings.draft_n_accepted")}
    if "prompt_ms" in timings:
        out["prefill_s"] = _seconds_from_ms(timings["prompt_ms"], "timings.prompt_ms")
    if "prompt_n" in timings:
        out["prompt_tokens"] = _count(timings["prompt_n"], "timings.prompt_n")
    return out


def sglang_stats(meta_info: dict) -> dict:
    """DecodeStats fields from SGLang's ``meta_info``: ``spec_verify_ct`` = verification forwards
    (our ``target_forwards`` and ``rounds``). SGLang reports no drafted/accepted counts; its
    ``spec_accept_length`` (= completion tokens / verify count) matches our
    ``mean_acceptance_length`` computed from those forwards.

    Raises:
        BadField: a value that is not a count.
    """
    out: dict = {}
    if "spec_verify_ct" in meta_info:
        out["target_forwards"] = out["rounds"] = _count(meta_info["spec_verify_ct"],
                                                        "meta_info.spec_verify_ct")
    if "prompt_tokens" in meta_info:
        out["prompt_tokens"] = _count(meta_info["prompt_tokens"], "meta_info.prompt_tokens")
    return out


def lmstudio_stats(stats: dict) -> dict:
    """DecodeStats fields from LM Studio's ``stats``: total / accepted draft tokens.

    Raises:
        BadField: a value that is not a count.
    """
    def count(name: str) -> int:
        return _count(stats[name], f"stats.{name}")
    out: dict = {}
    if "total_draft_tokens_count" in stats:
        out["drafted"] = count("total_draft_tokens_count")
    elif "accepted_draft_tokens_count" in stats and "rejected_draft_tokens_count" in stats:
        out["drafted"] = count("accepted_draft_tokens_count") + count("rejected_draft_tokens_count")
    if "accepted_draft_tokens_count" in stats:
        out["accepted"] = count("accepted_draft_tokens_count")
    return out


VLLM_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_accepted_tokens_per_pos")
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d+)"')


def vllm_counters(text: str) -> dict:
    """vLLM's speculative-decoding counters from a Prometheus text page, summed over labels
    (engines, models): {name: total} and {"...per_pos": {position: total}}. Names are given
    without the ``_total`` suffix the exposition adds to counters."""
    out: dict = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        if name.endswith("_total"):
            name = name[:-6]
        if name not in VLLM_COUNTERS:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):  # NaN / +Inf are valid samples, not counts
            continue
        if name.endswith("_per_pos"):
            pos = _POSITION.search(m.group(2) or "")
            if pos:
                per = out.setdefault(name, {})
                per[int(pos.group(1))] = per.get(int(pos.group(1)), 0.0) + value
        else:
            out[name] = out.get(name, 0.0) + value
    return out


def vllm_stats(before: dict, after: dict) -> dict:
    """DecodeStats fields from the deltas of vLLM's counters around one request.

    drafts = verification rounds with a draft (our ``rounds`` and ``target_forwards``, so
    ``mean_acceptance_length`` is vLLM's 1 + accepted / drafts up to the first token); every
    round drafts every position, so ``position_drafted[i]`` = drafts.
    """
    if "vllm:spec_decode_num_drafts" not in after:
        return {}

    def delta(name: str) -> int:
        return int(round(after.get(name, 0.0) - before.get(name, 0.0)))
    drafts = delta("vllm:spec_decode_num_drafts")
    out = {"drafted": delta("vllm:spec_decode_num_draft_tokens"),
           "accepted": delta("vllm:spec_decode_num_accepted_tokens"),
           "rounds": drafts, "target_forwards": drafts}
    per_after = after.get("vllm:spec_decode_num_accepted_tokens_per_pos", {})
    per_before = before.get("vllm:spec_decode_num_accepted_tokens_per_pos", {})
    if per_after:
        k = max(per_after) + 1
        out["position_accepted"] = [int(round(per_after.get(i, 0.0) - per_before.get(i, 0.0)))
                                    for i in range(k)]
        out["position_drafted"] = [drafts] * k
    return out


REPORTABLE = ("drafted", "accepted", "target_forwards", "rounds", "prefill_s",
              "position_drafted", "position_accepted")


def apply_reported(stats: DecodeStats, reported: dict) -> DecodeStats:
    """Set what the engine reported; every counter it did not report becomes None and is listed
    in ``stats.not_reported``."""
    for name in REPORTABLE:
        setattr(stats, name, reported.get(name))
    if "prompt_tokens" in reported:
        stats.prompt_tokens = reported["prompt_tokens"]
    for name in ALWAYS_NOT_REPORTED:
        setattr(stats, name, None)
    stats.drafted_by, stats.accepted_by = None, None
    stats.not_reported = [n for n in REPORTABLE if reported.get(n) is None] + list(ALWAYS_NOT_REPORTED)
    return stats


# --- the stream ---------------------------------------------------------------------------------

def _choice(chunk: dict) -> dict | None:
    """The first choice of a chunk (None for a chunk without one, e.g. the usage chunk).

    Raises:
        BadField: ``choices`` is not a list, or its first entry not an object.
    """
    choices = chunk.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        raise BadField("choices", choices, "a list")
    return _object(choices[0], "choices[0]", optional=False) if choices else None


def _chunk_text(chunk: dict) -> str:
    """The text a chunk adds (``delta.content`` on chat, ``text`` on completions).

    Raises:
        BadField: either is not a string (or null).
    """
    choice = _choice(chunk)
    if choice is None:
        return ""
    if "delta" in choice:
        delta = _object(choice.get("delta"), "choices[0].delta") or {}
        return _text(delta.get("content"), "choices[0].delta.content") or ""
    return _text(choice.get("text"), "choices[0].text") or ""


def _finish(chunk: dict) -> str | None:
    choice = _choice(chunk)
    return _text(choice.get("finish_reason"), "choices[0].finish_reason") if choice else None


def _find(chunk: dict, key: str):
    """``chunk[key]`` at the top level or in the first choice (engines differ); None when
    absent.

    Raises:
        BadField: present but not an object.
    """
    if chunk.get(key) is not None:
        return _object(chunk[key], key)
    choice = _choice(chunk)
    if choice is not None and choice.get(key) is not None:
        return _object(choice[key], f"choices[0].{key}")
    return None


@dataclass
class ChunkParts:
    """What one streamed chunk says, each field checked for its type.

    Attributes:
        text: the text it adds (``""`` for none).
        ids: token ids it carries (llama-server's ``__verbose.tokens``), else [].
        finish: ``finish_reason`` of the first choice, or None.
        usage: ``{"completion_tokens", "prompt_tokens"}`` present in ``usage``, else None.
        reported: DecodeStats fields from the engine's own counters (``*_stats``).
        predicted_n: llama-server's ``timings.predicted_n`` (tokens so far), else None.
        model: the chunk's ``model`` field, else None.
    """

    text: str
    ids: list[int]
    finish: str | None
    usage: dict | None
    reported: dict
    predicted_n: int | None
    model: str | None

    @classmethod
    def read(cls, chunk: dict) -> "ChunkParts":
        """Raises: BadField naming the first field of the wrong type."""
        reported: dict = {}
        timings = _object(chunk.get("timings"), "timings")
        predicted_n = None
        if timings is not None:
            reported.update(llama_cpp_stats(timings))
            if timings.get("predicted_n") is not None:
                predicted_n = _count(timings["predicted_n"], "timings.predicted_n")
        for key, mapper in (("meta_info", sglang_stats), ("stats", lmstudio_stats)):
            found = _find(chunk, key)
            if found:
                reported.update(mapper(found))
        raw_usage = _object(chunk.get("usage"), "usage")
        usage = None
        if raw_usage:
            usage = {name: _count(raw_usage[name], f"usage.{name}")
                     for name in ("completion_tokens", "prompt_tokens")
                     if raw_usage.get(name) is not None}
        return cls(_chunk_text(chunk), _chunk_ids(chunk), _finish(chunk), usage, reported,
                   predicted_n, _text(chunk.get("model"), "model"))


def _chunk_parts(data: str, url: str) -> "ChunkParts":
    """The parts of one ``data:`` line of an OpenAI stream, every field checked.

    Raises:
        EndpointError: a chunk that is not JSON, not an object, an error the server reports
            mid-answer, no ``choices``, or a field of the wrong type (one sentence).
    """
    try:
        chunk = json.loads(data)
    except ValueError:
        raise EndpointError(f"the server at {shown_url(url)} sent a stream that is not OpenAI's "
                            "(a chunk is not JSON)") from None
    if not isinstance(chunk, dict):
        raise EndpointError(f"the server at {shown_url(url)} sent a stream that is not OpenAI's")
    if "error" in chunk:
        raise EndpointError(f"the server at {shown_url(url)} reported an error "
                            f"mid-answer{_error_detail(data)}")
    if "choices" not in chunk:
        raise EndpointError(f"the server at {shown_url(url)} sent a chunk without 'choices': "
                            "it is not an OpenAI-compatible stream")
    with answer_of(url):  # a field of the wrong type: one sentence
        return ChunkParts.read(chunk)


def _check_finished(url: str, ended: bool, chunks: int, usage) -> None:
    """Raise EndpointError when a stream (not cancelled) closed before its end or held no
    answer."""
    if not ended:
        raise EndpointError(f"the server at {shown_url(url)} closed the stream after {chunks} "
                            "chunks of the answer without finishing it (no finish_reason, no "
                            "[DONE])")
    if chunks == 0 and usage is None:
        raise EndpointError(f"the server at {shown_url(url)} streamed no answer")


def _count_chunk(stats: DecodeStats, part: "ChunkParts", counted: int, now_s: float,
                 reported: dict) -> None:
    """Update ``stats`` for a chunk with text that arrived ``now_s`` seconds after the request:
    first-token and elapsed time, new tokens (the server's ``predicted_n``, else ``counted``:
    ids seen, or chunks), the counters reported so far (llama-server sends timings per chunk)."""
    if stats.ttft_s is None:
        stats.ttft_s = now_s
    stats.elapsed_s = now_s
    stats.new_tokens = part.predicted_n if part.predicted_n is not None else counted
    apply_reported(stats, reported)


def stream_events(endpoint: Endpoint, messages: list[dict], settings,
                  cancel: threading.Event | None = None,
                  max_new_tokens: int | None = None) -> Iterator["DecodeEvent"]:
    """Stream one request; yields DecodeEvents (one per chunk with text, then a final one).

    Args:
        endpoint: the server.
        messages: ``[{"role", "content"}, ...]`` (system prompt included when there is one).
        settings: :class:`specdemo.services.pipeline.DecodeSettings` (draft length is the server's).
        cancel: set it to stop reading; the last event then has finish_reason ``cancelled``.
    Every field read from the stream is checked (:class:`ChunkParts`). ``stats.served_model``
    is what the server says it serves: llama-server's ``/props`` model file, else the stream's
    ``model`` field, else the ``/v1/models`` id requested.

    Raises:
        EndpointError: one sentence: no connection, a timeout, a TLS mismatch, an HTTP error, an
            answer that is not OpenAI's (a field of the wrong type is named), or a server that
            closed the stream before its end (the answer is finished by ``[DONE]``, or by a
            ``finish_reason`` when the stream then closes without ``[DONE]``).
    """
    import httpx

    from ..core.engine import DecodeEvent  # lazy: imports torch; --help stays fast
    with endpoint.client() as client:
        endpoint.detect(client)
        body = request_body(endpoint, messages, settings, max_new_tokens)
        before = _vllm_metrics(client, endpoint) if endpoint.engine == "vllm" else None
        path = "/v1/chat/completions" if endpoint.api == "chat" else "/v1/completions"
        stats = DecodeStats(engine=endpoint.engine)
        stats.served_model = endpoint.served_file or endpoint.listed_model
        ids: list[int] = []
        chunks, usage, reported, finish, model = 0, None, {}, None, None
        start = time.perf_counter()
        ended = False
        try:
            with client.stream("POST", endpoint.url + path, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise EndpointError(f"the server at {shown_url(endpoint.url)} answered HTTP "
                                        f"{response.status_code}{_error_detail(response.text)}")
                for line in response.iter_lines():
                    if cancel is not None and cancel.is_set():
                        finish = "cancelled"
                        break
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                        break
                    part = _chunk_parts(data, endpoint.url)
                    finish = part.finish or finish
                    usage = part.usage or usage
                    reported.update(part.reported)
                    model = model or part.model  # the first chunk's name
                    stats.served_model = endpoint.served_file or model or endpoint.listed_model
                    if not part.text and not part.ids:
                        continue
                    chunks += 1
                    ids += part.ids
                    _count_chunk(stats, part, len(ids) or chunks, time.perf_counter() - start,
                                 reported)
                    yield DecodeEvent(part.ids, [False] * len(part.ids), part.text, stats.copy())
                else:  # closed without [DONE]: an answer with a finish_reason ended, else it was cut
                    ended = finish is not None
        except httpx.HTTPError as exc:
            during = f" after {chunks} chunks of the answer" if chunks else ""
            raise EndpointError(_describe_http(exc, endpoint.url, during)) from None
        if finish != "cancelled":
            _check_finished(endpoint.url, ended, chunks, usage)
        if before is not None:
            reported.update(vllm_stats(before, _vllm_metrics(client, endpoint)))
    if usage:
        stats.new_tokens = usage.get("completion_tokens", stats.new_tokens)
        stats.prompt_tokens = usage.get("prompt_tokens", 0)
    apply_reported(stats, reported)
    stats.finish_reason = {"stop": "stop", "length": "length"}.get(finish, finish)
    yield DecodeEvent([], [], "", stats.copy(), done=True)


def _chunk_ids(chunk: dict) -> list[int]:
    """Token ids in a chunk when the server sends them (llama-server: ``__verbose.tokens`` on
    ``/v1/completions`` with ``verbose``); else [].

    Raises:
        BadField: ``__verbose`` not an object, ``tokens`` not a list of token ids.
    """
    verbose = _object(chunk.get("__verbose"), "__verbose")
    if verbose is None or verbose.get("tokens") is None:
        return []
    tokens = verbose["tokens"]
    if not isinstance(tokens, list):
        raise BadField("__verbose.tokens", tokens, "a list of token ids")
    return [_count(t, f"__verbose.tokens[{i}]") for i, t in enumerate(tokens)]


def _vllm_metrics(client, endpoint: Endpoint) -> dict:
    try:
        response = client.get(endpoint.url + "/metrics")
        return vllm_counters(response.text) if response.status_code == 200 else {}
    except Exception:  # no /metrics: acceptance not reported, the lane still runs
        return {}


# --- a lane in the race ---------------------------------------------------------------------

class EndpointPipeline:
    """What :class:`specdemo.services.race.Race` needs of a lane's pipeline, served by an endpoint.

    ``prompt_ids`` returns the messages (the server applies its own chat template) and
    ``stream`` streams them; nothing is loaded here, so a server that is down fails in its own
    lane when that lane runs, and the other lane still runs.
    """

    is_endpoint = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def prompt_ids(self, messages: list[dict] | str, system: str | None = None) -> list[dict]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not any(m["content"].strip() for m in messages):
            raise ValueError("the prompt is empty: type something to send")
        return ([{"role": "system", "content": system}] if system else []) + list(messages)

    def stream(self, messages: list[dict], settings, speculative: bool = False,
               cancel: threading.Event | None = None) -> Iterator["DecodeEvent"]:
        return stream_events(self.endpoint, messages, settings, cancel)


def format_value(value, spec: str = ".2f") -> str:
    """A counter for text output: ``not reported by this engine`` for None."""
    if value is None:
        return NOT_REPORTED_TEXT
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:{spec}}"
    return str(value)


# --- command line -----------------------------------------------------------------------------

def add_endpoint_flags(parser, lanes: bool = True) -> None:
    """``--plain-endpoint``/``--spec-endpoint`` and their options (run, compare, bench)."""
    group = parser.add_argument_group(
        "server lanes", "race an OpenAI-compatible server (llama-server, vLLM, SGLang, LM Studio) "
        "in a lane instead of our engine; a lane without an endpoint is our engine (--target, "
        "and --draft for the speculative lane)")
    group.add_argument("--plain-endpoint", default=None, metavar="URL",
                       help="base URL of the server for the plain lane, e.g. http://127.0.0.1:8080")
    group.add_argument("--spec-endpoint", default=None, metavar="URL",
                       help="base URL of the server for the speculative lane (a server started "
                            "with a draft, e.g. python -m specdemo serve llama.cpp --draft ngram)")
    group.add_argument("--endpoint-model", default=None, metavar="NAME",
                       help="model name to request (default: the first one the server lists)")
    group.add_argument("--endpoint-key-env", default=None, metavar="VAR",
                       help="name of the environment variable holding the API key (the key is "
                            "never printed)")
    group.add_argument("--endpoint-api", default="chat", choices=list(APIS),
                       help="chat: /v1/chat/completions (the server's chat template); "
                            "completions: /v1/completions (raw text; llama-server then returns "
                            "token ids)")
    group.add_argument("--endpoint-timeout", default=60.0, metavar="S",
                       type=checked(inputs.number, "endpoint timeout (seconds)", above=0),
                       help="seconds to wait for a connection or a chunk, above 0 (default "
                            "%(default)s)")
    group.add_argument("--allow-remote-endpoint", action="store_true",
                       help="allow an endpoint that is not on this machine (the prompt leaves it)")


def endpoints_from_args(args) -> dict[str, Endpoint | None]:
    """{"plain": Endpoint or None, "speculative": Endpoint or None} from the flags.

    Raises:
        EndpointError: a malformed or remote URL (without the flag), an unset key variable.
    """
    def make(url):
        if not url:
            return None
        return Endpoint(url, args.endpoint_model, args.endpoint_key_env, args.endpoint_api,
                        args.endpoint_timeout, args.allow_remote_endpoint)
    return {"plain": make(getattr(args, "plain_endpoint", None)),
            "speculative": make(getattr(args, "spec_endpoint", None))}


def format_endpoint_stats(label: str, s: DecodeStats) -> str:
    """Text lines for a server lane's stats: what it did not report says so."""
    inputs = {"acceptance_rate": ("drafted", "accepted"),
              "mean_acceptance_length": ("target_forwards",)}

    def v(name, spec=".2f"):
        value = getattr(s, name)
        unreported = {name, *inputs.get(name, ())} & set(s.not_reported)
        if value is None and not unreported:
            return "n/a"  # reported, but nothing to divide (e.g. nothing drafted)
        return format_value(value, spec)
    lines = [f"[{label}] engine={s.engine} new_tokens={s.new_tokens} "
             f"tokens_per_s={v('tokens_per_s')} decode_tokens_per_s={v('decode_tokens_per_s')} "
             f"ttft_s={v('ttft_s', '.3f')} finish_reason={s.finish_reason}",
             f"    drafted={v('drafted')} accepted={v('accepted')} "
             f"acceptance_rate={v('acceptance_rate')} "
             f"mean_acceptance_length={v('mean_acceptance_length')} "
             f"target_forwards={v('target_forwards')}"]
    if s.not_reported:
        lines.append(f"    {NOT_REPORTED_TEXT}: {', '.join(s.not_reported)}")
    return "\n".join(lines)

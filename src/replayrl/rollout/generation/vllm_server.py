"""Sampling from a vLLM server in a process of its own (rollout.backend = vllm_server), the
shape of TRL's `vllm_mode="server"`: the server runs on GPUs of its own (`replayrl serve-vllm`
starts it), the trainer talks HTTP to it and pushes the policy's weights after every update.

What goes over the wire (vLLM's OpenAI-compatible server; tried on 0.32):
- Generation: one POST /v1/completions per prompt, the prompt as token ids (our tokenisation,
  as every backend), `n` completions, the prompt's own `seed` (its n samples take seed + 0..n-1
  in vLLM, as in the in-process backend: the same request seeds, from the same hash), every
  filter off, `logprobs: 0` (the sampled token's log-prob only) and `return_token_ids`, so the
  completion's token ids come back exactly, not re-tokenised text. The server is started with
  `--logprobs-mode processed_logprobs`: the log-probs are log softmax(logits / T), what the
  learner recomputes.
- Weights: the policy's tensors are written as safetensors shards (at most 256 MiB each) into
  a folder both processes see (`vllm.server.weights_dir`; by default one in /dev/shm), then
  POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": folder}} and
  POST /reset_prefix_cache. Both endpoints exist only with VLLM_SERVER_DEV_MODE=1, which
  `replayrl serve-vllm` sets. The current policy is pushed once at start too: a server that
  served another run (or a resumed run's earlier checkpoint) computes with this run's weights.

Every failure of the server (unreachable, an error status, another model, no answer in time,
an answer of the wrong shape) is a `GenerationServerError` that names the URL and what to do.
Only the standard library speaks HTTP here.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from replayrl.errors import GenerationServerError
from replayrl.models.lora_merge import merged_lora_tensors
from replayrl.rollout.generation.base import Sample, SamplingParams
from replayrl.rollout.generation.stops import cut_at_stop
from replayrl.rollout.generation.vllm import (
    full_tensors,
    request_seed,
    with_tied_head,
    write_weights_folder,
)
from replayrl.rollout.generation.vllm_settings import VLLMConfig

# the token strings of `return_tokens_as_token_ids` (vLLM's format_token_id_placeholder)
TOKEN_ID_PREFIX = "token_id:"
# an error body is quoted up to this many characters
DETAIL_CHARS = 300
# /reset_prefix_cache answers success=false while blocks are still held: tries, 0.5 s apart
RESET_TRIES = 5


class ServerClient:
    """JSON over HTTP to one server; every failure is a GenerationServerError."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        what = f"{method} {self.url}{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise GenerationServerError(
                f"the vLLM server answered {what} with HTTP {exc.code}: {_detail(exc)}"
                + _dev_mode_hint(path, exc.code)
            ) from None
        except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                raise GenerationServerError(
                    f"the vLLM server did not answer {what} within {self.timeout_s:g} s "
                    "(vllm.server.request_timeout_s)"
                ) from None
            raise GenerationServerError(
                f"cannot reach the vLLM server at {self.url} ({what}: {reason}); start it with "
                "`replayrl serve-vllm --config <the run's config>` or set vllm.server.base_url"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise GenerationServerError(
                f"the vLLM server answered {what} with something other than JSON: "
                f"{raw[:DETAIL_CHARS]!r}"
            ) from None

    def wait_until_up(self, timeout_s: float) -> None:
        """Poll GET /health until it answers 200 (a starting server takes a minute or more to
        load its model); after `timeout_s`, the last failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.get("/health")
                return
            except GenerationServerError as exc:
                if time.monotonic() >= deadline:
                    raise GenerationServerError(
                        f"no vLLM server ready at {self.url} after {timeout_s:g} s "
                        f"(vllm.server.connect_timeout_s): {exc}"
                    ) from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _detail(exc: urllib.error.HTTPError) -> str:
    """The message of an error body ({"error": {"message"}} or {"detail"}), else its text."""
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        body = json.loads(raw)
        err = body.get("error") if isinstance(body, dict) else None
        text = err.get("message") if isinstance(err, dict) else None
        text = text or (body.get("detail") if isinstance(body, dict) else None) or raw.decode()
    except ValueError:
        text = raw.decode(errors="replace") or str(exc.reason)
    return str(text)[:DETAIL_CHARS]


def _dev_mode_hint(path: str, code: int) -> str:
    if code == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
        return (
            f" ({path} exists only on a server started with VLLM_SERVER_DEV_MODE=1, as "
            "`replayrl serve-vllm` does)"
        )
    return ""


def served_model(client: ServerClient, expected: Sequence[str]) -> tuple[str, int | None]:
    """(the served model's name, its max_model_len) when GET /v1/models lists one of the
    names in `expected` (as its id or the path it was loaded from); else the error says what
    the server serves."""
    body = client.get("/v1/models")
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list):
        raise GenerationServerError(f"{client.url}/v1/models answered without a model list")
    wanted = {_same_path(n) for n in expected}
    for card in cards:
        if not isinstance(card, dict):
            continue
        names = {_same_path(str(card.get(k))) for k in ("id", "root") if card.get(k)}
        if names & wanted:
            limit = card.get("max_model_len")
            return str(card["id"]), int(limit) if isinstance(limit, int) else None
    serving = ", ".join(str(c.get("id")) for c in cards if isinstance(c, dict)) or "nothing"
    raise GenerationServerError(
        f"the vLLM server at {client.url} serves {serving}, not this run's model "
        f"({' or '.join(expected)}): start it on the run's model (`replayrl serve-vllm "
        "--config <the run's config>`), or set vllm.server.model to the name it serves if "
        "that is the same model (its weights are replaced by the policy's at start)"
    )


def _same_path(name: str) -> str:
    """A name as compared: a local folder by its real path, anything else as written."""
    return os.path.realpath(name) if os.path.isdir(name) else name


class VLLMServerGenerator:
    """Generates through a vLLM server; `load_weights` pushes new policy weights into it."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        cfg: VLLMConfig,
        expected_models: Sequence[str],
        policy_version: int = 0,
        seed: int = 0,
        stop_ids: list[int] | None = None,
        lora_scaling: float | None = None,
        tied_head: bool = False,
    ) -> None:
        server = cfg.server
        self.client = ServerClient(server.url, server.request_timeout_s)
        self.client.wait_until_up(server.connect_timeout_s)
        self.model_name, self.max_model_len = served_model(self.client, expected_models)
        if cfg.max_model_len is not None and self.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, cfg.max_model_len)
        self.tokenizer = tokenizer
        self.policy_version = policy_version
        self.seed = seed
        self.lora_scaling = lora_scaling  # a LoRA policy: pushed weights merged, base + s B A
        self.tied_head = tied_head
        eos = tokenizer.eos_token_id
        self.stop_ids = list(stop_ids) if stop_ids else ([] if eos is None else [eos])
        self.concurrency = server.max_concurrent_requests
        self._calls = (policy_version, 0)  # (version, sampled calls at it): request seeds
        self._weights_dir = server.weights_dir
        self._folder: Path | None = None

    # -- generation ------------------------------------------------------------------------
    def _request_seeds(self, prompts: int, num_samples: int, greedy: bool) -> list[int | None]:
        """The in-process backend's seeds: one per prompt, its n samples seed + 0..n-1."""
        if greedy:
            return [None] * prompts
        version, calls = self._calls
        if version != self.policy_version:
            version, calls = self.policy_version, 0
        self._calls = (version, calls + 1)
        first = request_seed(self.seed, version, calls)
        return [first + p * num_samples for p in range(prompts)]

    def payload(
        self, ids: list[int], num_samples: int, params: SamplingParams, seed: int | None
    ) -> dict[str, Any]:
        """The /v1/completions body of one prompt: every filter off, so the sampled
        distribution is softmax(logits / T) (argmax when greedy)."""
        if not params.greedy and params.top_p < 1.0:
            raise ValueError(
                f"rollout.backend=vllm_server with top_p={params.top_p}: vLLM's log-probs are "
                "then renormalised over the top-p set, not log softmax(logits / temperature) "
                "as the learner assumes; use top_p=1 or rollout.backend=hf"
            )
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": ids,
            "n": num_samples,
            "max_tokens": params.max_new_tokens,
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 0,  # only the sampled token's log-prob
            "stop_token_ids": self.stop_ids,
            "skip_special_tokens": True,
            "return_token_ids": True,  # the completion's ids themselves, not text
            "return_tokens_as_token_ids": True,  # the log-probs' tokens as "token_id:N"
            "stream": False,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def generate(
        self, prompts: list[str], num_samples: int, params: SamplingParams
    ) -> list[Sample]:
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if self.max_model_len is not None and encoded:
            longest = max(len(ids) for ids in encoded)
            if longest + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"a prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} "
                    f"exceeds the vLLM server's max_model_len={self.max_model_len} (start it "
                    "with a larger --max-model-len, vllm.max_model_len for serve-vllm)"
                )
        seeds = self._request_seeds(len(encoded), num_samples, params.greedy)
        bodies = [
            self.payload(ids, num_samples, params, seed)
            for ids, seed in zip(encoded, seeds, strict=True)
        ]
        workers = max(1, min(self.concurrency, len(bodies)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm-server") as pool:
            answers = list(pool.map(lambda b: self.client.post("/v1/completions", b), bodies))
        samples: list[Sample] = []
        for index, (ids, answer) in enumerate(zip(encoded, answers, strict=True)):
            samples += self._samples(index, ids, num_samples, answer)
        return samples

    def _samples(self, index: int, ids: list[int], n: int, answer: Any) -> list[Sample]:
        """One prompt's answer as its n Samples, checked: the model, the choice count, the
        prompt's ids and every completion token's log-prob."""
        where = f"{self.client.url}/v1/completions"
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise GenerationServerError(f"{where} answered without choices: {answer!r:.300}")
        if answer.get("model") != self.model_name:
            raise GenerationServerError(
                f"{where} answered for model {answer.get('model')!r}, not {self.model_name!r}"
            )
        choices = sorted(answer["choices"], key=lambda c: int(c.get("index", 0)))
        if len(choices) != n:
            raise GenerationServerError(f"{where} returned {len(choices)} completions, not {n}")
        prompt_ids = torch.tensor(ids, dtype=torch.long)
        out = []
        for choice in choices:
            if choice.get("prompt_token_ids") not in (None, ids):
                raise GenerationServerError(f"{where} generated from other prompt ids than sent")
            token_ids, logprobs = completion_tokens(choice, where)
            out.append(self._to_sample(index, prompt_ids, token_ids, logprobs, choice))
        return out

    def _to_sample(
        self,
        index: int,
        prompt_ids: torch.Tensor,
        token_ids: list[int],
        logprobs: list[float],
        choice: dict[str, Any],
    ) -> Sample:
        token_ids, logprobs, stopped = cut_at_stop(token_ids, logprobs, self.stop_ids)
        completion = torch.tensor(token_ids, dtype=torch.long)
        return Sample(
            prompt_index=index,
            prompt_ids=prompt_ids.clone(),
            completion_ids=completion,
            logprobs=torch.tensor(logprobs, dtype=torch.float32),
            text=str(self.tokenizer.decode(completion, skip_special_tokens=True)),
            # "length": max_tokens reached; "stop": EOS or another stop token
            truncated=not stopped and choice.get("finish_reason") != "stop",
            policy_version=self.policy_version,
        )

    # -- weights ---------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New policy weights (HF names; sharded ones gathered one at a time, LoRA merged, a
        tied head added) written to the shared folder, reloaded by the server from there; the
        stale prefix cache dropped."""
        named: Iterable[tuple[str, torch.Tensor]] = full_tensors(named_tensors)
        if self.lora_scaling is not None:
            named = merged_lora_tensors(named, self.lora_scaling)
        named = with_tied_head(named, self.tied_head)
        folder = self._weights_folder()
        write_weights_folder(named, folder)
        self.client.post(
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
        )
        self._reset_prefix_cache()
        self.policy_version = version

    def _reset_prefix_cache(self) -> None:
        """Cached prefix blocks hold keys/values of the old weights: dropped, or an error."""
        for _ in range(RESET_TRIES):
            answer = self.client.post("/reset_prefix_cache", {})
            if not isinstance(answer, dict) or answer.get("success") is not False:
                return
            time.sleep(0.5)
        raise GenerationServerError(
            f"{self.client.url}/reset_prefix_cache refused {RESET_TRIES} times (blocks still "
            "held by running requests): its cache would keep the old weights' keys and values"
        )

    def _weights_folder(self) -> Path:
        """A folder of this generator's own under vllm.server.weights_dir (else in /dev/shm
        where the system has one); removed when the generator is."""
        if self._folder is None:
            if self._weights_dir is not None:
                where: str | None = self._weights_dir
                Path(self._weights_dir).mkdir(parents=True, exist_ok=True)
            else:
                shm = Path("/dev/shm")
                where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
            self._folder = Path(tempfile.mkdtemp(prefix="replayrl-weights-", dir=where))
            weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        return self._folder


def completion_tokens(choice: Any, where: str) -> tuple[list[int], list[float]]:
    """(token ids, their log-probs) of one returned completion, checked against each other."""
    token_ids = choice.get("token_ids") if isinstance(choice, dict) else None
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(token_ids, list) or not isinstance(lp, dict):
        raise GenerationServerError(
            f"{where} returned a completion without token ids or log-probs (a vLLM server "
            "older than 0.10 has no return_token_ids)"
        )
    values, tokens = lp.get("token_logprobs"), lp.get("tokens")
    if not isinstance(values, list) or len(values) != len(token_ids) or None in values:
        raise GenerationServerError(f"{where} returned no log-prob for some completion tokens")
    if isinstance(tokens, list) and tokens != [f"{TOKEN_ID_PREFIX}{t}" for t in token_ids]:
        raise GenerationServerError(f"{where} returned log-probs of other tokens than its ids")
    return [int(t) for t in token_ids], [float(v) for v in values]


def server_command(
    cfg: VLLMConfig,
    model_path: str,
    dtype: str,
    seed: int,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of a vLLM OpenAI server for `vllm_server` runs: the run's
    model folder, the sampling log-probs the learner recomputes, its own generation defaults
    ignored (every request sets every knob), the dev-mode endpoints of the weight push."""
    server = cfg.server
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    argv += ["--host", server.host, "--port", str(server.port), "--dtype", dtype]
    argv += ["--seed", str(seed), "--logprobs-mode", "processed_logprobs"]
    argv += ["--generation-config", "vllm"]
    argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if server.model is not None:
        argv += ["--served-model-name", server.model]
    if cfg.max_model_len is not None:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(extra), {"VLLM_SERVER_DEV_MODE": "1"}

"""rollout.backend=vllm_server against a stand-in server in this process that speaks the
endpoints of vLLM's OpenAI server (GET /health, GET /v1/models, POST /v1/completions,
POST /collective_rpc, POST /reset_prefix_cache): the request bodies (prompt token ids, n,
per-prompt seeds, logprobs, every filter off), how answers become Samples, the weight push
(shards in the shared folder, reload_weights, then the prefix cache), and a clear
GenerationServerError for every failure of the server. The real server: test_vllm_server.py."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from replayrl.config.schema import ConfigError, load_config
from replayrl.errors import GenerationServerError, RunFailed
from replayrl.rollout.generation import SamplingParams, make_generator
from replayrl.rollout.generation.vllm import request_seed
from replayrl.rollout.generation.vllm_server import VLLMServerGenerator
from replayrl.rollout.generation.vllm_settings import VLLMConfig, vllm_settings
from tiny import tiny_config

NAME = "stub-model"
EOS = 1
SAMPLE = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=5)


class StubServer:
    """A vLLM server's endpoints on 127.0.0.1; records every request (path, body) and, at
    each reload_weights, the tensors of the folder it names."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.pushed: list[dict[str, torch.Tensor]] = []
        self.health_failures = 0  # /health answers 503 this many times first
        self.fail: dict[str, tuple[int, Any]] = {}  # path -> (status, body)
        self.delay_s = 0.0  # before answering /v1/completions
        self.answer_model = NAME  # the model a completion answer names
        self.token_prefix = "token_id:"
        self.reset_success = True
        self.stop_after: int | None = None  # the completion ends with EOS at this position
        self.root = "/models/stub"  # the folder the served model was loaded from
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                stub.requests.append((self.path, None))
                if self.path == "/health":
                    if stub.health_failures > 0:
                        stub.health_failures -= 1
                        return self._send(503, {"detail": "loading"})
                    return self._send(200, {})
                if self.path == "/v1/models":
                    card = {"id": NAME, "root": stub.root, "max_model_len": 64}
                    return self._send(200, {"object": "list", "data": [card]})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((self.path, body))
                if self.path in stub.fail:
                    return self._send(*stub.fail[self.path])
                if self.path == "/v1/completions":
                    time.sleep(stub.delay_s)
                    return self._send(200, stub.completions(body))
                if self.path == "/collective_rpc":
                    folder = Path(body["kwargs"]["weights_path"])
                    state: dict[str, torch.Tensor] = {}
                    for shard in sorted(folder.glob("*.safetensors")):
                        state.update(load_file(shard))
                    stub.pushed.append(state)
                    return self._send(200, {"results": [None]})
                if self.path == "/reset_prefix_cache":
                    return self._send(200, {"success": stub.reset_success})
                self._send(404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """n completions drawn from the request's seed (seed + index, as vLLM's children);
        token ids 3.. and log-prob -(0.1 + position / 100)."""
        choices = []
        for i in range(body["n"]):
            rng = random.Random(None if body.get("seed") is None else body["seed"] + i)
            ids = [rng.randrange(3, 17) for _ in range(body["max_tokens"])]
            finish = "length"
            if self.stop_after is not None:
                ids = ids[: self.stop_after] + [EOS]
                finish = "stop"
            lp = [-(0.1 + k / 100) for k in range(len(ids))]
            choices.append(
                {
                    "index": i,
                    "text": "",
                    "finish_reason": finish,
                    "token_ids": ids,
                    "prompt_token_ids": body["prompt"],
                    "logprobs": {
                        "token_logprobs": lp,
                        "tokens": [f"{self.token_prefix}{t}" for t in ids],
                        "top_logprobs": [
                            {f"token_id:{t}": v} for t, v in zip(ids, lp, strict=True)
                        ],
                        "text_offset": [0] * len(ids),
                    },
                }
            )
        return {"id": "cmpl-1", "object": "text_completion", "model": self.answer_model,
                "choices": choices}  # fmt: skip

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def bodies(self, path: str) -> list[Any]:
        return [b for p, b in self.requests if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


def server_cfg(url: str, **server: Any) -> VLLMConfig:
    return VLLMConfig.model_validate(
        {"server": {"base_url": url, "connect_timeout_s": 5, **server}}
    )


def generator(stub: StubServer, tokenizer: Any, **server: Any) -> VLLMServerGenerator:
    return VLLMServerGenerator(tokenizer, server_cfg(stub.url, **server), [NAME], seed=11)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- requests and answers -------------------------------------------------------------------
def test_each_prompt_is_one_request_of_its_token_ids_and_seed(stub, char_tokenizer):
    gen = generator(stub, char_tokenizer)
    gen.policy_version = 4
    prompts = ["1+2=", "9="]
    samples = gen.generate(prompts, 3, SAMPLE)
    bodies = stub.bodies("/v1/completions")
    assert len(bodies) == 2
    first = request_seed(11, 4, 0)  # the in-process backend's seed of this call
    for p, body in enumerate(sorted(bodies, key=lambda b: b["seed"])):
        assert body["prompt"] == char_tokenizer(prompts[p], add_special_tokens=False)["input_ids"]
        assert body["seed"] == first + p * 3
        assert body["n"] == 3 and body["max_tokens"] == 5 and body["temperature"] == 0.7
        assert body["model"] == NAME and body["logprobs"] == 0
        assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
        assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (
            1.0, 0, 0.0, 1.0,
        )  # fmt: skip
        assert body["stop_token_ids"] == [char_tokenizer.eos_token_id]
    # grouped prompt by prompt, each sample the stub's draw for seed + index
    assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
    for j, s in enumerate(samples):
        rng = random.Random(first + j)
        assert s.completion_ids.tolist() == [rng.randrange(3, 17) for _ in range(5)]
        assert torch.allclose(s.logprobs, -(0.1 + torch.arange(5) / 100))
        assert s.truncated and s.policy_version == 4
    # the next call at this version draws new seeds; a resumed run at version 4 the same ones
    gen.generate(prompts, 3, SAMPLE)
    assert min(b["seed"] for b in stub.bodies("/v1/completions")[2:]) == request_seed(11, 4, 1)


def test_greedy_sends_no_seed_and_a_stop_ends_the_completion(stub, char_tokenizer):
    gen = generator(stub, char_tokenizer)
    stub.stop_after = 2
    (s,) = gen.generate(["1+2="], 1, SamplingParams(max_new_tokens=5, greedy=True))
    (body,) = stub.bodies("/v1/completions")
    assert body["temperature"] == 0.0 and "seed" not in body
    assert s.completion_ids.numel() == 3 and s.completion_ids[-1].item() == EOS
    assert not s.truncated


def test_prompts_past_the_servers_context_and_top_p_are_refused(stub, char_tokenizer):
    gen = generator(stub, char_tokenizer)  # the stub's max_model_len is 64
    with pytest.raises(ValueError, match="max_model_len=64"):
        gen.generate(["1" * 62], 1, SAMPLE)
    with pytest.raises(ValueError, match="top_p=0.9"):
        gen.generate(["1+2="], 1, SamplingParams(top_p=0.9))
    assert stub.bodies("/v1/completions") == []


def test_requests_in_flight_are_bounded(stub, char_tokenizer):
    """max_concurrent_requests=2: never more than two prompts at the server at once."""
    gen = generator(stub, char_tokenizer, max_concurrent_requests=2)
    live, peak, lock = [0], [0], threading.Lock()
    answer = stub.completions

    def counted(body: dict[str, Any]) -> dict[str, Any]:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return answer(body)

    stub.completions = counted  # type: ignore[method-assign]
    gen.generate(["1=", "2=", "3=", "4=", "5=", "6="], 1, SAMPLE)
    assert peak[0] == 2


# -- weights ----------------------------------------------------------------------------------
def test_a_push_writes_the_weights_then_reloads_and_drops_the_cache(
    stub, char_tokenizer, tiny_model, tmp_path
):
    gen = VLLMServerGenerator(
        char_tokenizer,
        server_cfg(stub.url, weights_dir=str(tmp_path / "shared")),
        [NAME],
        tied_head=True,
    )
    gen.load_weights(tiny_model.named_parameters(), 7)
    assert stub.paths()[-2:] == ["/collective_rpc", "/reset_prefix_cache"]
    (rpc,) = stub.bodies("/collective_rpc")
    assert rpc["method"] == "reload_weights"
    assert Path(rpc["kwargs"]["weights_path"]).parent == tmp_path / "shared"
    (state,) = stub.pushed
    want = dict(tiny_model.named_parameters())
    # every parameter, and with tied embeddings the head too (the reload unties them)
    assert set(state) == set(want) | {"lm_head.weight"}
    for name, t in want.items():
        assert torch.equal(state[name], t.detach())
    assert torch.equal(state["lm_head.weight"], want["model.embed_tokens.weight"].detach())
    assert gen.policy_version == 7


def test_a_lora_policy_pushes_plain_names_with_the_adapters_merged(
    stub, char_tokenizer, tiny_model, tiny_model_config
):
    pytest.importorskip("peft")
    import copy

    from replayrl.models.loading import apply_lora, unwrap_model

    lora_cfg = tiny_model_config.model_copy(
        update={"lora": tiny_model_config.lora.model_copy(update={"enabled": True, "r": 2})}
    )
    policy = apply_lora(copy.deepcopy(tiny_model), lora_cfg, seed=0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    gen = VLLMServerGenerator(
        char_tokenizer, server_cfg(stub.url), [NAME], lora_scaling=16 / 2, tied_head=True
    )
    gen.load_weights(unwrap_model(policy).named_parameters(), 1)
    (state,) = stub.pushed
    assert set(state) == {n for n, _ in tiny_model.named_parameters()} | {"lm_head.weight"}
    merged = copy.deepcopy(policy).merge_and_unload()
    for name, t in merged.named_parameters():
        assert torch.allclose(state[name], t, atol=1e-6), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(state[q], dict(tiny_model.named_parameters())[q])


def test_a_refused_cache_reset_is_an_error(stub, char_tokenizer, tiny_model, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    gen = generator(stub, char_tokenizer)
    stub.reset_success = False
    with pytest.raises(GenerationServerError, match="reset_prefix_cache refused"):
        gen.load_weights(tiny_model.named_parameters(), 1)
    assert gen.policy_version == 0


def test_the_backend_pushes_at_start_and_after_every_step(stub, tmp_path):
    """A 2-step run: one push when the generator is built (the server may hold another run's
    weights), one after each update; the last one is the trained policy."""
    from replayrl.run.start import train

    cfg = tiny_config(
        tmp_path / "runs",
        "rollout.backend=vllm_server",
        f"vllm.server.base_url={stub.url}",
        f"vllm.server.model={NAME}",
        "train.steps=2",
        "train.device=cpu",
        "checkpoint.every=2",
        "rewards=[{name: digits_format}]",  # the stub's random tokens score differently
    )
    summary = train(cfg)
    assert len(stub.pushed) == 3
    assert stub.paths().index("/collective_rpc") < stub.paths().index("/v1/completions")
    bodies = stub.bodies("/v1/completions")
    assert sum(b["n"] == 4 and "seed" in b for b in bodies) == 2 * 2  # 2 prompts a step
    # the start and final evaluations (8 prompts each, greedy) go to the server too
    assert sum(b["temperature"] == 0.0 for b in bodies) == 2 * 8 == len(bodies) - 4
    final = Path(summary["run_dir"]) / "final"
    assert final.is_dir(), sorted(p.name for p in Path(summary["run_dir"]).iterdir())
    saved = {}
    for shard in final.glob("*.safetensors"):
        saved.update(load_file(shard))
    assert saved and all(torch.equal(stub.pushed[-1][k], v) for k, v in saved.items())
    assert not all(torch.equal(stub.pushed[0][k], v) for k, v in saved.items())


# -- failures ---------------------------------------------------------------------------------
def test_an_unreachable_server_is_one_clear_error(char_tokenizer):
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(GenerationServerError) as err:
        VLLMServerGenerator(char_tokenizer, server_cfg(url, connect_timeout_s=0.5), [NAME])
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "cannot reach the vLLM server" in msg and url in msg and "serve-vllm" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert isinstance(err.value, RunFailed)  # the CLI prints it in one line


def test_a_starting_server_is_waited_for(stub, char_tokenizer):
    stub.health_failures = 2
    generator(stub, char_tokenizer)
    assert stub.paths()[:4] == ["/health"] * 3 + ["/v1/models"]


def test_another_model_is_refused(stub, char_tokenizer):
    with pytest.raises(GenerationServerError, match="serves stub-model, not this run's model"):
        VLLMServerGenerator(char_tokenizer, server_cfg(stub.url), ["/models/other"])
    # a model named by the path it was loaded from is the same model
    VLLMServerGenerator(char_tokenizer, server_cfg(stub.url), ["/models/stub"])
    gen = generator(stub, char_tokenizer)
    stub.answer_model = "other"
    with pytest.raises(GenerationServerError, match="answered for model 'other'"):
        gen.generate(["1+2="], 1, SAMPLE)


@pytest.mark.parametrize(
    ("path", "status", "body", "match"),
    [
        ("/v1/completions", 500, {"error": {"message": "engine died"}}, "HTTP 500: engine died"),
        ("/v1/completions", 400, {"detail": "bad seed"}, "HTTP 400: bad seed"),
        ("/collective_rpc", 404, {"detail": "Not Found"}, "VLLM_SERVER_DEV_MODE=1"),
    ],
)
def test_an_error_status_is_quoted(stub, char_tokenizer, tiny_model, path, status, body, match):
    gen = generator(stub, char_tokenizer)
    stub.fail[path] = (status, body)
    with pytest.raises(GenerationServerError, match=match) as err:
        if path == "/collective_rpc":
            gen.load_weights(tiny_model.named_parameters(), 1)
        else:
            gen.generate(["1+2="], 2, SAMPLE)
    assert err.value.__cause__ is None and path in str(err.value)


def test_a_slow_answer_times_out(stub, char_tokenizer):
    gen = generator(stub, char_tokenizer, request_timeout_s=0.2)
    stub.delay_s = 1.0
    with pytest.raises(GenerationServerError, match="did not answer .* within 0.2 s"):
        gen.generate(["1+2="], 1, SAMPLE)


def test_answers_of_the_wrong_shape_are_refused(stub, char_tokenizer):
    gen = generator(stub, char_tokenizer)
    stub.token_prefix = "tok:"  # log-probs that do not name the returned ids
    with pytest.raises(GenerationServerError, match="other tokens than its ids"):
        gen.generate(["1+2="], 1, SAMPLE)
    stub.token_prefix = "token_id:"
    stub.completions = lambda body: {"model": NAME, "choices": []}  # type: ignore[method-assign]
    with pytest.raises(GenerationServerError, match="returned 0 completions, not 2"):
        gen.generate(["1+2="], 2, SAMPLE)


# -- config and command -----------------------------------------------------------------------
def test_server_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="vllm.server.base_url"):
        load_config(None, ["vllm.server.base_url=localhost:8000"])
    cfg = load_config(None, ["vllm.server.host=10.0.0.2", "vllm.server.port=9000"])
    assert vllm_settings(cfg).server.url == "http://10.0.0.2:9000"
    cfg = load_config(None, ["vllm.server.base_url=http://gen:8000/"])
    assert vllm_settings(cfg).server.url == "http://gen:8000"
    with pytest.raises(ConfigError, match="workers.generators=1"):
        load_config(
            None, ["runtime=async-local", "rollout.backend=vllm_server", "workers.generators=2"]
        )


def cfg_keys(stub: StubServer) -> list[str]:
    return ["rollout.backend=vllm_server", f"vllm.server.base_url={stub.url}", "train.seed=5"]


def test_make_generator_builds_the_server_backend(stub, tmp_path, char_tokenizer, tiny_model):
    """model.path's folder is what the server must serve (vllm.server.model unset)."""
    cfg = load_config(None, cfg_keys(stub))
    with pytest.raises(GenerationServerError, match="not this run's model"):
        make_generator(cfg, tiny_model, char_tokenizer, str(tmp_path))
    named = cfg.model_copy(
        update={
            "vllm": vllm_settings(cfg).model_copy(
                update={"server": vllm_settings(cfg).server.model_copy(update={"model": NAME})}
            )
        }  # fmt: skip
    )
    gen = make_generator(named, tiny_model, char_tokenizer, str(tmp_path))
    assert isinstance(gen, VLLMServerGenerator) and gen.seed == 5
    assert len(stub.pushed) == 1  # the policy's weights at start
    # a resumed run loads its checkpoint's folder; the server serves the config's model.path
    folder = tmp_path / "base"
    tiny_model.save_pretrained(folder)
    stub.root = str(folder)
    resumed = load_config(None, [*cfg_keys(stub), f"model.path={folder}"])
    make_generator(resumed, tiny_model, char_tokenizer, str(tmp_path / "ckpt" / "policy"))
    assert len(stub.pushed) == 2


def test_serve_vllm_prints_the_server_command(tmp_path, tiny_model, char_tokenizer, capsys):
    from replayrl.cli.main import main

    folder = tmp_path / "model"
    tiny_model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    code = main(
        [
            "serve-vllm",
            f"model.path={folder}",
            "vllm.server.port=8123",
            "vllm.max_model_len=256",
            "vllm.enforce_eager=true",
            "precision.generation=float32",
            "--vllm-args=--max-num-seqs 8",
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("VLLM_SERVER_DEV_MODE=1 ")
    for flag in (
        f"-m vllm.entrypoints.openai.api_server --model {folder}",
        "--host 127.0.0.1 --port 8123",
        "--dtype float32",
        "--logprobs-mode processed_logprobs",
        "--generation-config vllm",
        "--max-model-len 256",
        "--enforce-eager",
        "--max-num-seqs 8",
    ):
        assert flag in out, flag


def test_cli_reports_an_unreachable_server_in_one_line(tmp_path, capsys):
    from replayrl.cli.main import main

    code = main(
        [
            "train",
            "--config",
            "demo",
            "rollout.backend=vllm_server",
            f"vllm.server.base_url=http://127.0.0.1:{free_port()}",
            "vllm.server.connect_timeout_s=0",
            f"logging.run_dir={tmp_path}",
            *[o for o in __import__("tiny").TINY_RUN],
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot reach the vLLM server" in lines[0]
    assert "Traceback" not in err


def test_a_completion_is_cut_after_its_first_stop_token() -> None:
    from replayrl.rollout.generation.stops import cut_at_stop

    assert cut_at_stop([5, 2, 7, 2], [-0.1, -0.2, -0.3, -0.4], [2, 9]) == (
        [5, 2],
        [-0.1, -0.2],
        True,
    )
    assert cut_at_stop([5, 7], [-0.1, -0.3], [2]) == ([5, 7], [-0.1, -0.3], False)

"""Reference pages generated from the code are current (scripts/gen_trl_args_doc.py)."""

from __future__ import annotations

from pathlib import Path

from replayrl.api import trl_args
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _gen():
    return load_script("gen_trl_args_doc")


def test_committed_trl_arguments_page_matches_the_code() -> None:
    committed = (ROOT / "docs" / "trl-arguments.md").read_text()
    assert committed == _gen().render(), "run: python scripts/gen_trl_args_doc.py"


def test_every_known_trl_argument_is_on_the_page_with_what_it_becomes() -> None:
    gen = _gen()
    text = gen.render()
    for name in trl_args.KNOWN:
        assert f"`{name}`" in text, name
    translated = {*trl_args.SPECIAL, *trl_args.COMPLETIONS}
    assert translated <= set(gen.TRANSLATED), translated - set(gen.TRANSLATED)
    for name, (_, why) in trl_args.REFUSED.items():
        assert why in text, name
    assert "| `fsdp` |" in text and "runtime='ray'" in text  # several GPUs: the alternative


def test_several_gpus_table_matches_what_is_refused() -> None:
    from replayrl.config.schema import ConfigError, load_config

    page = (ROOT / "docs" / "gpu.md").read_text()
    table = page.split("## Several GPUs", 1)[1].split("\n## ", 1)[0]
    for name in ("fsdp", "deepspeed", "parallelism_config", "vllm_mode"):
        assert f"`{name}" in table and name in trl_args.REFUSED, name
    assert "refused at config load" in table
    try:
        load_config(None, ["vllm.tensor_parallel_size=2"])
    except ConfigError:
        pass
    else:
        raise AssertionError("vllm.tensor_parallel_size=2 is documented as refused")
    for key in ("workers.learners", "ray.learner_num_gpus", "ray.generator_num_gpus"):
        load_config(None, [f"{key}=1"])  # the documented keys exist

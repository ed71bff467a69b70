"""Checks that every vLLM flag, value and VLLM_* variable in docker-compose.yaml exists in the pinned vLLM (0.32.0); run with `tests/run.sh tests/real_vllm`.

A typo in the compose file otherwise shows up only as a user's failed four-minute cold start on
the GPU box. The answers come from the installed vLLM itself (realvllm.INTROSPECT): the real
`vllm serve --help=all`, vLLM's serve parser and validation run on the compose command, its
parser registries and `vllm.envs`.
"""
import pytest
from realvllm import (
    CPU_MAX_MODEL_LEN,
    TYPO_ENV,
    TYPO_FLAGS,
    compose_vllm_command,
    compose_vllm_variables,
    cpu_serve_args,
    split_flags,
)

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def facts(vllm_introspection):
    return vllm_introspection.result()


def help_flags(help_text: str) -> set[str]:
    """Every option named in argparse help ("  --a, --no-a  ..." or "  --b B  ...")."""
    flags = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("--"):
            for part in stripped.split(", "):
                word = part.strip().split(" ")[0].split("=")[0]
                if word.startswith("--"):
                    flags.add(word)
    return flags


def test_help_is_the_real_full_help(facts):
    known = help_flags(facts["help"])
    assert len(known) > 200, "`vllm serve --help=all` printed too few flags to be the full help"
    assert {"--max-model-len", "--enable-prefix-caching", "--no-enable-prefix-caching"} <= known


def test_help_lists_every_compose_flag(facts, compose_vllm):
    used = [flag for flag, _ in split_flags(compose_vllm_command(compose_vllm)[1:])]
    assert used, "the compose vllm command has no flags"
    assert [f for f in used if f not in help_flags(facts["help"])] == []


def test_vllm_parses_and_validates_the_compose_command(facts):
    """Unknown flags, wrong value types, invalid choices (--dtype float16 is checked here, not
    on the CPU server) and serve rules (--enable-auto-tool-choice needs a parser) fail here."""
    case = facts["cases"]["compose"]
    assert case["parse_error"] is None
    assert case["parsed"] is not None


def test_parser_names_are_registered(facts, compose_vllm):
    parsed = facts["cases"]["compose"]["parsed"]
    assert parsed["model_tag"] == compose_vllm_command(compose_vllm)[0]
    assert parsed["reasoning_parser"] in facts["reasoning_parsers"]
    assert parsed["tool_call_parser"] in facts["tool_parsers"]


def test_every_vllm_variable_exists_with_a_valid_value(facts, compose_vllm):
    used = compose_vllm_variables(compose_vllm)
    assert used, "the compose vllm service sets no VLLM_* variable"
    assert sorted(set(used) - set(facts["env_names"])) == []
    assert facts["cases"]["compose"]["env_errors"] == {}


def test_the_checks_catch_typos(facts):
    """The same checks on deliberately misspelled flags, parser and variables all fail."""
    typo = facts["cases"]["typo"]
    assert TYPO_FLAGS[0] not in help_flags(facts["help"])
    assert typo["parse_error"] is not None and TYPO_FLAGS[0] in typo["parse_error"]
    assert TYPO_FLAGS[2] not in facts["reasoning_parsers"]
    assert set(typo["env_errors"]) == set(TYPO_ENV)
    assert "VLLM_NO_SUCH_SETTING" not in facts["env_names"]


def test_cpu_translation_changes_only_what_a_cpu_cannot_do(tmp_path):
    """The fixture's rewrite of a compose command: GPU-only flags go with their values, the
    listed values are replaced, everything else (either flag form) passes in order."""
    command = ["org/model", "--served-model-name", "foundation", "--gpu-memory-utilization", "0.93",
               "--max-model-len=253952", "--enable-prefix-caching", "--dtype", "float16",
               "--speculative-config", '{"method": "mtp"}', "--reasoning-parser", "qwen3"]
    argv = cpu_serve_args(command, tmp_path, 8123)
    assert argv == [str(tmp_path), "--served-model-name", "foundation", "--max-model-len", str(CPU_MAX_MODEL_LEN),
                    "--enable-prefix-caching", "--dtype", "float32", "--reasoning-parser", "qwen3",
                    "--host", "127.0.0.1", "--port", "8123", "--enforce-eager", "--enable-log-requests"]


def test_extra_args_are_appended_like_the_entrypoint_does():
    config = {"services": {"vllm": {
        "entrypoint": ["/bin/sh", "-c", 'eval "set -- \\"\\$$@\\" $${EXTRA_VLLM_ARGS:-}"'],
        "command": ["org/model", "--max-num-seqs", "1", ""],
        "environment": {"EXTRA_VLLM_ARGS": "--speculative-config '{\"method\": \"mtp\"}' --seed 3"},
    }}}
    assert compose_vllm_command(config) == ["org/model", "--max-num-seqs", "1",
                                            "--speculative-config", '{"method": "mtp"}', "--seed", "3"]
    assert compose_vllm_variables(config) == {}

"""Verifier routing, scratch and capacity plans: the CLI's numbers, the environment, errors."""
import json

import numpy as np
import pytest

import nvfp4mla


def cli_json(cli, *args, env=None):
    return json.loads(cli("plan", *args, "--json", env=env).stdout)


@pytest.mark.parametrize("case", [
    dict(mode="on", num_speculative_tokens=3, max_query_len=4, any_prefill=True, decode_rows=16),
    dict(mode="auto", num_speculative_tokens=1, max_query_len=2, decode_rows=64, decode_row_budget=32),
])
def test_route_matches_the_cli(case, cli):
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    d = nvfp4mla.plan_route(cfg, **case)
    args = ["route", "--rope", "fp8", "--scale-mode", "dynamic", "--mode", case["mode"],
            "--spec-tokens", case["num_speculative_tokens"], "--max-query-len", case["max_query_len"],
            "--decode-rows", case["decode_rows"]]
    if case.get("any_prefill"):
        args.append("--prefilling")
    if "decode_row_budget" in case:
        args += ["--decode-row-budget", case["decode_row_budget"]]
    if "max_q_per_request" in case:
        args += ["--max-q-per-request", case["max_q_per_request"]]
    want = cli_json(cli, *args)
    assert (d.route, d.reason) == (want["route"], want["reason"])


def test_route_reads_the_mode_variable():
    cfg = nvfp4mla.FormatConfig()
    shape = dict(num_speculative_tokens=1, max_query_len=2, decode_rows=8)
    assert nvfp4mla.plan_route(cfg, **shape).route == "decode"  # auto: qualified
    assert nvfp4mla.plan_route(cfg, **shape, environ={"VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE": "0"}).route == "extend"
    with pytest.raises(nvfp4mla.Error, match="invalid verifier route mode 'maybe'"):
        nvfp4mla.plan_route(cfg, **shape, mode="maybe")
    assert nvfp4mla.parse_spec_decode_mode(" TRUE ") == "on"
    assert nvfp4mla.decode_qualified(cfg)
    assert nvfp4mla.decode_q_per_request(cfg, 2, mode="auto") == 3
    assert nvfp4mla.decode_q_per_request(cfg, 2, mode="off") == 1


@pytest.mark.parametrize("case", [
    dict(num_heads=128, max_num_seqs=64, num_speculative_tokens=1),
    dict(num_heads=32, max_num_seqs=8, max_num_batched_tokens=4096, dcp_world_size=2, topk=1024, splits=4,
         partials="bf16", mode="off", num_speculative_tokens=2),
])
def test_scratch_matches_the_cli(case, cli):
    cfg = nvfp4mla.FormatConfig(rope="fp8")
    p = nvfp4mla.plan_scratch(cfg, **case)
    args = ["scratch", "--rope", "fp8", "--heads", case["num_heads"], "--max-num-seqs", case["max_num_seqs"],
            "--mode", case.get("mode", "auto"), "--mtp", case.get("num_speculative_tokens", 0)]
    for key, flag in (("max_num_batched_tokens", "--max-batched-tokens"), ("dcp_world_size", "--dcp"),
                      ("topk", "--topk"), ("splits", "--splits"), ("partials", "--partials")):
        if key in case:
            args += [flag, case[key]]
    want = cli_json(cli, *args)
    for key, value in want.items():
        assert getattr(p, key) == value, key
    assert p.workspace_bytes == p.tmp_output_bytes + p.tmp_lse_bytes


def test_scratch_covers_every_decode_plan_up_to_its_rows():
    cfg = nvfp4mla.FormatConfig()
    p = nvfp4mla.plan_scratch(cfg, num_heads=64, max_num_seqs=16, topk=2048)
    for rows in range(1, p.decode_rows + 1):
        plan = nvfp4mla.plan_decode(cfg, rows, 64, 2048, sm_count=132)
        assert plan.workspace_bytes <= p.workspace_bytes, rows


def test_capacity_matches_the_cli(cli):
    cfg = nvfp4mla.FormatConfig(rope="fp8", scale_mode="dynamic")
    p = nvfp4mla.plan_capacity(cfg, layers=61, memory_gib=80, reserved_gib=4.5, page_size=64)
    want = cli_json(cli, "capacity", "--rope", "fp8", "--scale-mode", "dynamic", "--layers", 61, "--memory-gib", 80,
                    "--reserved-gib", 4.5, "--page-size", 64)
    assert (p.bytes_per_token, p.pages, p.tokens, p.max_single_request_tokens) == (
        want["bytes_per_token"], want["pages"], want["tokens"], want["max_single_request_tokens"])
    assert p.bytes_per_token == 61 * (368 + 132)


def test_planner_errors_carry_the_library_message():
    cfg = nvfp4mla.FormatConfig()
    with pytest.raises(nvfp4mla.Error, match="capacity plan: the reserved memory exceeds the budget"):
        nvfp4mla.plan_capacity(cfg, layers=61, memory_gib=1, reserved_gib=2)
    with pytest.raises(nvfp4mla.Error, match="scratch plan: heads and DCP world size must be positive"):
        nvfp4mla.plan_scratch(cfg, num_heads=0, max_num_seqs=4)
    with pytest.raises(nvfp4mla.ArgumentError, match="partials"):
        nvfp4mla.plan_scratch(cfg, num_heads=16, max_num_seqs=4, partials="fp16")


def test_planner_integers_outside_their_c_type_are_refused_not_truncated():
    cfg = nvfp4mla.FormatConfig()
    with pytest.raises(nvfp4mla.ArgumentError, match=r"plan_scratch: num_heads must be in .*, got 4294967312"):
        nvfp4mla.plan_scratch(cfg, num_heads=2 ** 32 + 16, max_num_seqs=4)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_scratch: max_num_batched_tokens"):
        nvfp4mla.plan_scratch(cfg, num_heads=16, max_num_seqs=4, max_num_batched_tokens=2 ** 63)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_capacity: layers"):
        nvfp4mla.plan_capacity(cfg, layers=2 ** 32 + 61, memory_gib=80)
    with pytest.raises(nvfp4mla.ArgumentError, match="plan_route: num_speculative_tokens"):
        nvfp4mla.plan_route(cfg, 2 ** 32 + 1, mode="on")
    with pytest.raises(nvfp4mla.ArgumentError, match="decode_q_per_request: num_speculative_tokens"):
        nvfp4mla.decode_q_per_request(cfg, 2 ** 32 + 1, mode="on")
    with pytest.raises(nvfp4mla.ArgumentError, match="verifier_rows: tokens_per_request"):
        nvfp4mla.verifier_rows([1, 2], tokens_per_request=2 ** 32 + 2, topk=64)


def test_verifier_rows():
    causal, lengths = nvfp4mla.verifier_rows([10, 3000], tokens_per_request=2, topk=2048, padded_rows=6)
    assert causal.tolist() == [11, 12, 3001, 3002, 0, 0]
    assert lengths.dtype == np.int32 and lengths.tolist() == [11, 12, 2048, 2048, 0, 0]
    with pytest.raises(nvfp4mla.Error, match="3 padded rows cannot hold 4"):
        nvfp4mla.verifier_rows([1, 2], tokens_per_request=2, topk=64, padded_rows=3)

"""FormatConfig: flags, the vLLM variables, validation messages and record identities."""
import hashlib
import os

import pytest

import nvfp4mla
from conftest import ALL_FORMATS, config_args, format_id

NATIVE_IDENTITIES = {
    ("bf16", "bf16", "implicit"): "bf16:1152:v1",
    ("fp8_ds_mla", "bf16", "implicit"): "fp8_ds_mla:656:v1",
    ("nvfp4_ds_mla", "bf16", "implicit"): "nvfp4_ds_mla:bf16-rope-432:implicit-unit-v1",
    ("nvfp4_ds_mla", "fp8", "implicit"): "nvfp4_ds_mla:fp8-rope-368:implicit-unit-v1",
    ("nvfp4_ds_mla", "fp8", "dynamic"): "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1",
}


def test_defaults_are_the_432_byte_nvfp4_record():
    c = nvfp4mla.FormatConfig()
    assert (c.cache_dtype, c.rope, c.scale_mode, c.record_bytes) == ("nvfp4_ds_mla", "bf16", "implicit", 432)
    assert c.layer_scale == 1.0 and c.layer is None
    assert c.record_abi() == "nvfp4_ds_mla:bf16-rope-432:implicit-unit-v1"
    assert c.record_abi(compat="vllm") == "vllm-default-v1"
    assert "432 bytes/token" in c.describe()


@pytest.mark.parametrize("key,identity", NATIVE_IDENTITIES.items())
def test_identities(key, identity):
    dtype, rope, mode = key
    kwargs = {"cache_dtype": dtype} if dtype != "nvfp4_ds_mla" else {"rope": rope, "scale_mode": mode}
    c = nvfp4mla.FormatConfig(**kwargs)
    assert c.record_abi() == identity
    assert c.record_bytes == int(identity.split(":")[1].split("-")[-1])
    vllm = c.record_abi(compat="vllm")
    assert vllm == (identity if mode == "dynamic" else "vllm-default-v1")


@pytest.mark.parametrize("f,compat", [(ALL_FORMATS[3], "native"), (ALL_FORMATS[2], "vllm")],
                         ids=lambda v: format_id(v) if isinstance(v, dict) else v)
def test_identity_matches_the_cli(f, compat, cli):
    c = nvfp4mla.FormatConfig(**f)
    assert cli("abi", *config_args(f), "--compat", compat).stdout.strip() == c.record_abi(compat=compat)


def test_static_identity_names_the_calibration_file(calibration_file, cli):
    c = nvfp4mla.FormatConfig(rope="fp8", scales_file=calibration_file, layer=1)
    digest = hashlib.sha256(calibration_file.read_bytes()).hexdigest()
    assert c.scale_mode == "static"
    assert c.record_abi() == "nvfp4_ds_mla:fp8-rope-368:static-calibrated-v1:" + digest
    assert c.record_abi() == cli("abi", "--rope", "fp8", "--scales-file", calibration_file, "--layer", 1).stdout.strip()
    assert c.layer == 1
    assert c.layer_scale == pytest.approx(12.0 / 2688.0, rel=1e-7)
    assert c.layer_scale_for(3) == pytest.approx(96.0 / 2688.0, rel=1e-7)
    assert c.for_layer(2).layer_scale == pytest.approx(0.25 / 2688.0, rel=1e-7)
    assert c.for_layer(2).record_abi() == c.record_abi()
    assert c.scales_file == str(calibration_file)
    assert nvfp4mla.FormatConfig().scales_file is None


def test_scales_file_may_be_bytes_or_a_path(calibration_file):
    for path in (os.fsencode(calibration_file), calibration_file, str(calibration_file)):
        c = nvfp4mla.FormatConfig(scales_file=path, layer=1)
        assert c.scales_file == str(calibration_file) and c.layer == 1


def test_layers_outside_int32_are_refused_not_truncated(calibration_file):
    # ctypes keeps the low 32 bits: 2**32 was layer 0.
    with pytest.raises(nvfp4mla.ArgumentError, match=r"FormatConfig: layer must be in .*, got 4294967296"):
        nvfp4mla.FormatConfig(scales_file=calibration_file, layer=2 ** 32)
    c = nvfp4mla.FormatConfig(scales_file=calibration_file, layer=1)
    with pytest.raises(nvfp4mla.ArgumentError, match="layer_scale_for: layer"):
        c.layer_scale_for(2 ** 32 + 3)
    with pytest.raises(nvfp4mla.ArgumentError, match="FormatConfig: layer"):
        c.for_layer(-2 ** 31 - 1)


def test_static_without_a_layer_serves_identity_but_not_kernels(calibration_file):
    c = nvfp4mla.FormatConfig(scales_file=calibration_file)
    assert c.record_abi().startswith("nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:")
    with pytest.raises(nvfp4mla.Error, match="choose which layer"):
        c.validate()
    with pytest.raises(nvfp4mla.Error, match="choose which layer"):
        c.layer_scale


def test_missing_layer_is_an_error_unless_unit_scale_is_asked_for(calibration_file):
    with pytest.raises(nvfp4mla.Error, match="layer"):
        nvfp4mla.FormatConfig(scales_file=calibration_file, layer=7)
    c = nvfp4mla.FormatConfig(scales_file=calibration_file, layer=7, unit_scale_for_missing_layer=True)
    assert c.layer_scale == 1.0


def test_bare_layer_scale_has_no_identity():
    c = nvfp4mla.FormatConfig(layer_scale=0.5)
    assert c.scale_mode == "static" and c.layer_scale == 0.5
    assert c.validate() is c
    with pytest.raises(nvfp4mla.Error, match="SHA-256"):
        c.record_abi()


@pytest.mark.parametrize("kwargs,message", [
    (dict(cache_dtype="int4"), "unknown cache dtype 'int4'"),
    (dict(rope="fp16"), "unknown RoPE encoding 'fp16'"),
    (dict(scale_mode="auto"), "unknown scale mode 'auto'"),
    (dict(scale_mode="dynamic"), "dynamic scale mode requires the 368-byte record"),
    (dict(cache_dtype="fp8_ds_mla", rope="fp8"), "--rope applies to nvfp4_ds_mla only"),
    (dict(scale_mode="static"), "static scale mode needs a calibration"),
    (dict(layer_scale=-1.0), "--layer-scale must be a finite positive number"),
    (dict(scales_file="/nonexistent/scales.json", layer=0), "/nonexistent/scales.json"),
])
def test_invalid_combinations_raise_the_library_message(kwargs, message):
    with pytest.raises(nvfp4mla.Error, match=message.replace("(", r"\(")):
        nvfp4mla.FormatConfig(**kwargs)


def test_from_env_reads_the_vllm_variables(calibration_file):
    env = {"VLLM_NVFP4_MLA_DYNAMIC_SCALE": "1", "KV_FP8_ROPE": "1"}
    c = nvfp4mla.FormatConfig.from_env(environ=env)
    assert (c.rope, c.scale_mode, c.record_bytes) == ("fp8", "dynamic", 368)
    c = nvfp4mla.FormatConfig.from_env(environ={"VLLM_NVFP4_MLA_SCALES_FILE": str(calibration_file)}, layer=0)
    assert c.scale_mode == "static" and c.layer_scale == pytest.approx(1.5 / 2688.0, rel=1e-7)
    # An empty scales file variable means unset.
    assert nvfp4mla.FormatConfig.from_env(environ={"VLLM_NVFP4_MLA_SCALES_FILE": "  "}).scale_mode == "implicit"
    # Arguments win over the variables.
    c = nvfp4mla.FormatConfig.from_env(environ={"KV_FP8_ROPE": "1"}, rope="bf16")
    assert c.record_bytes == 432
    # The variables configure nvfp4_ds_mla only.
    assert nvfp4mla.FormatConfig.from_env(environ=env, cache_dtype="fp8_ds_mla").record_bytes == 656


def test_from_env_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("KV_FP8_ROPE", "1")
    assert nvfp4mla.FormatConfig.from_env().record_bytes == 368
    assert nvfp4mla.FormatConfig().record_bytes == 432  # the constructor reads no variable


@pytest.mark.parametrize("env,message", [
    ({"KV_FP8_ROPE": "yes"}, "KV_FP8_ROPE='yes' is not valid"),
    ({"VLLM_NVFP4_MLA_DYNAMIC_SCALE": "1", "VLLM_NVFP4_MLA_SCALES_FILE": "x.json", "KV_FP8_ROPE": "1"},
     "mutually exclusive"),
])
def test_invalid_environment_raises_the_library_message(env, message):
    with pytest.raises(nvfp4mla.Error, match=message):
        nvfp4mla.FormatConfig.from_env(environ=env)


def test_environment_matches_the_cli(cli):
    env = {"VLLM_NVFP4_MLA_DYNAMIC_SCALE": "1", "KV_FP8_ROPE": "1"}
    assert cli("abi", env=env).stdout.strip() == nvfp4mla.FormatConfig.from_env(environ=env).record_abi()


def test_record_abi_rejects_unknown_compat():
    with pytest.raises(nvfp4mla.ArgumentError, match="compat"):
        nvfp4mla.FormatConfig().record_abi(compat="sglang")

"""FormatConfig: the validated record format, and its identity (the record ABI)."""
import os
import weakref
from ctypes import byref, c_char_p, c_float, c_int32, c_void_p

from . import _lib
from ._lib import Format, FormatOptions, lib

ENV_DYNAMIC_SCALE = "VLLM_NVFP4_MLA_DYNAMIC_SCALE"
ENV_FP8_ROPE = "KV_FP8_ROPE"
ENV_SCALES_FILE = "VLLM_NVFP4_MLA_SCALES_FILE"


def _encode(value):
    """A C string of an argument: paths (str, bytes, os.PathLike) in the file system's encoding."""
    if value is None:
        return None
    if isinstance(value, (bytes, os.PathLike)):
        return os.fsencode(value)
    return str(value).encode()


class FormatConfig:
    """One immutable, validated description of how KV records are written and read.

    Arguments (each optional; unset ones take the defaults nvfp4_ds_mla, bf16 RoPE, implicit scale):

    - ``cache_dtype``: ``"nvfp4_ds_mla"`` (default), ``"fp8_ds_mla"`` or ``"bf16"``.
    - ``rope``: ``"bf16"`` (432-byte NVFP4 record) or ``"fp8"`` (368-byte).
    - ``scale_mode``: ``"implicit"``, ``"static"`` (per-layer calibrated) or ``"dynamic"`` (per token,
      368-byte record only).
    - ``scales_file`` and ``layer``: the calibration file (``nvfp4mla calibrate``) and which layer
      this configuration serves; or ``layer_scale``: a bare per-layer scale (no record identity).
    - ``unit_scale_for_missing_layer``: scale 1.0 for layers the file does not cover (MTP layers).

    Invalid combinations raise :class:`nvfp4mla.Error` with the library's message.
    ``FormatConfig.from_env()`` also reads the vLLM variables.
    """

    def __init__(self, cache_dtype=None, rope=None, scale_mode=None, scales_file=None, layer=None,
                 layer_scale=None, unit_scale_for_missing_layer=False, *, _environ=None):
        self._options = dict(cache_dtype=cache_dtype, rope=rope, scale_mode=scale_mode, scales_file=scales_file,
                             layer=layer, layer_scale=layer_scale,
                             unit_scale_for_missing_layer=unit_scale_for_missing_layer)
        self._environ = _environ
        env = _environ or {}
        o = FormatOptions(cache_dtype=_encode(cache_dtype), rope=_encode(rope), scale_mode=_encode(scale_mode),
                          scales_file=_encode(scales_file), has_layer=layer is not None,
                          layer=_lib.int32(layer, "FormatConfig", "layer") if layer is not None else 0,
                          has_layer_scale=layer_scale is not None,
                          layer_scale=float(layer_scale) if layer_scale is not None else 0.0,
                          unit_scale_for_missing_layer=bool(unit_scale_for_missing_layer),
                          env_dynamic_scale=_encode(env.get(ENV_DYNAMIC_SCALE)),
                          env_fp8_rope=_encode(env.get(ENV_FP8_ROPE)),
                          env_scales_file=_encode(env.get(ENV_SCALES_FILE)))
        handle = c_void_p()
        _lib.call(lib.nvfp4mla_config_create, byref(o), byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.nvfp4mla_config_destroy, handle)
        spec = Format()
        _lib.call(lib.nvfp4mla_config_spec, handle, byref(spec))
        self.cache_dtype = _lib.CACHE_DTYPES[spec.cache_dtype]
        self.rope = _lib.ROPES[spec.rope]
        self.scale_mode = _lib.SCALE_MODES[spec.scale_mode]
        rb = c_int32()
        _lib.call(lib.nvfp4mla_format_record_bytes, byref(spec), byref(rb))
        self.record_bytes = rb.value
        has, value = c_int32(), c_int32()
        _lib.call(lib.nvfp4mla_config_layer, handle, byref(has), byref(value))
        self.layer = value.value if has.value else None
        path = c_char_p()
        _lib.call(lib.nvfp4mla_config_scales_file, handle, byref(path))
        self.scales_file = os.fsdecode(path.value) or None  # the calibration file (static mode), if any
        # What the data functions take: spec + layer scale. Resolving the scale fails for a static
        # configuration without a chosen layer; that error is raised where the scale is needed.
        self._format = Format()
        status = lib.nvfp4mla_config_format(handle, byref(self._format))
        self._format_error = None if status == 0 else lib.nvfp4mla_last_error().decode()
        self._layer_scale = self._format.layer_scale if status == 0 else None

    @classmethod
    def from_env(cls, cache_dtype=None, rope=None, scale_mode=None, scales_file=None, layer=None, layer_scale=None,
                 unit_scale_for_missing_layer=False, environ=None):
        """A configuration from arguments and the vLLM variables, arguments winning:
        ``VLLM_NVFP4_MLA_DYNAMIC_SCALE=1`` (dynamic scale), ``KV_FP8_ROPE=1`` (368-byte record) and
        ``VLLM_NVFP4_MLA_SCALES_FILE`` (static scale from a calibration file; empty means unset).
        ``environ`` defaults to ``os.environ``."""
        source = os.environ if environ is None else environ
        env = {name: source[name] for name in (ENV_DYNAMIC_SCALE, ENV_FP8_ROPE, ENV_SCALES_FILE) if name in source}
        if not env.get(ENV_SCALES_FILE, "x").strip():
            del env[ENV_SCALES_FILE]
        return cls(cache_dtype, rope, scale_mode, scales_file, layer, layer_scale, unit_scale_for_missing_layer,
                   _environ=env)

    def for_layer(self, layer):
        """The same configuration serving another layer of its calibration file (static mode)."""
        options = dict(self._options, layer=layer)
        return FormatConfig(**options, _environ=self._environ)

    @property
    def layer_scale(self):
        """The outer scale writers and readers use: the layer's calibrated scale (or the bare
        ``layer_scale``) in static mode, 1.0 otherwise. Raises Error in static mode without a layer."""
        if self._format_error is not None:
            raise _lib.Error(self._format_error)
        return self._layer_scale

    def layer_scale_for(self, layer):
        """The calibrated scale of any layer of the calibration file (1.0 outside static mode)."""
        scale = c_float()
        _lib.call(lib.nvfp4mla_config_layer_scale_for, self._handle, _lib.int32(layer, "layer_scale_for", "layer"),
                  byref(scale))
        return scale.value

    def validate(self):
        """Checks that kernels can use this configuration as it is (a static one needs its layer
        chosen); raises Error with the library's message, returns self."""
        self.format()
        return self

    def record_abi(self, compat="native"):
        """The record identity that names everything persistent, e.g.
        ``"nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1"``. ``compat="vllm"`` gives vLLM's offload
        namespace token (``"vllm-default-v1"`` for formats vLLM names by default). A static
        configuration's identity names its calibration file's SHA-256; one built from a bare
        ``layer_scale`` has none (Error)."""
        if compat not in ("native", "vllm"):
            raise _lib.ArgumentError(f"record_abi: compat must be 'native' or 'vllm', got {compat!r}")
        out = c_char_p()
        _lib.call(lib.nvfp4mla_config_identity, self._handle, 1 if compat == "vllm" else 0, byref(out))
        return out.value.decode()

    def describe(self):
        """One-line description, e.g. ``"nvfp4_ds_mla, 368 bytes/token, RoPE fp8, scale dynamic"``."""
        out = c_char_p()
        _lib.call(lib.nvfp4mla_config_describe, self._handle, byref(out))
        return out.value.decode()

    def format(self):
        """The C struct the data functions take (spec + layer scale); raises for a static
        configuration without a layer."""
        if self._format_error is not None:
            raise _lib.Error(self._format_error)
        return self._format

    def __repr__(self):
        return f"FormatConfig({self.describe()})"

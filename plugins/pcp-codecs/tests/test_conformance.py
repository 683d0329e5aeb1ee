"""Every shipped codec, f32 included, passes the codec conformance suite."""

from pcp_core.testing.codec_suite import CodecConformance


class TestFloat32(CodecConformance):
    codec_name = "f32"


class TestBFloat16(CodecConformance):
    codec_name = "bf16"


class TestInt8(CodecConformance):
    codec_name = "int8"


class TestFp4(CodecConformance):
    codec_name = "fp4"


class TestTopK(CodecConformance):
    codec_name = "topk"

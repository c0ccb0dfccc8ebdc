"""Our .proto must be wire-compatible with the public KServe/Triton protocol, and the committed generated code
must match it.

Compatibility is checked against the descriptors shipped in tritonclient (the client users run): every message,
field, enum and RPC we declare must exist there with the same number, type and cardinality. Our generated module
is never imported in this process (it registers the same `inference.*` names as tritonclient's); the .proto is
compiled to a descriptor set instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

PROTO_DIR = Path(__file__).resolve().parents[3] / "gateway" / "kserve" / "proto"
PROTO = "kserve_inference.proto"


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path_factory.mktemp("proto") / "set.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", PROTO], check=True
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


@pytest.fixture(scope="module")
def triton_pool():
    from google.protobuf import descriptor_pool
    from tritonclient.grpc import model_config_pb2, service_pb2  # noqa: F401 - registers the descriptors

    return descriptor_pool.Default()


def _messages(prefix: str, messages) -> list[tuple[str, descriptor_pb2.DescriptorProto]]:
    out = []
    for message in messages:
        name = f"{prefix}.{message.name}"
        out.append((name, message))
        out.extend(_messages(name, message.nested_type))
    return out


def test_every_field_matches_the_public_protocol(ours, triton_pool) -> None:
    checked = 0
    for full_name, message in _messages(ours.package, ours.message_type):
        theirs = triton_pool.FindMessageTypeByName(full_name)
        for field in message.field:
            other = theirs.fields_by_name.get(field.name)
            assert other is not None, f"{full_name}.{field.name} is not in the public protocol"
            assert field.number == other.number, f"{full_name}.{field.name}: number {field.number} != {other.number}"
            assert field.type == other.type, f"{full_name}.{field.name}: type differs"
            repeated = field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
            assert repeated == other.is_repeated, f"{full_name}.{field.name}: cardinality differs"
            if field.type_name:
                target = other.message_type or other.enum_type
                assert field.type_name.lstrip(".") == target.full_name, f"{full_name}.{field.name}: type name differs"
            checked += 1
        for enum in message.enum_type:
            their_enum = theirs.enum_types_by_name[enum.name]
            assert {v.name: v.number for v in enum.value} == {v.name: v.number for v in their_enum.values}
    assert checked > 150  # the whole protocol, not a token subset


def test_top_level_enums_and_service(ours, triton_pool) -> None:
    for enum in ours.enum_type:
        theirs = triton_pool.FindEnumTypeByName(f"{ours.package}.{enum.name}")
        assert {v.name: v.number for v in enum.value} == {v.name: v.number for v in theirs.values}
    (service,) = ours.service
    theirs = triton_pool.FindServiceByName(f"{ours.package}.{service.name}")
    for method in service.method:
        other = theirs.methods_by_name[method.name]
        assert method.input_type.lstrip(".") == other.input_type.full_name
        assert method.output_type.lstrip(".") == other.output_type.full_name
        assert method.client_streaming == other.client_streaming and method.server_streaming == other.server_streaming
    assert len(service.method) == 12


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            PROTO,
        ],
        check=True,
    )
    fresh_grpc = (
        (tmp_path / "kserve_inference_pb2_grpc.py")
        .read_text()
        .replace("import kserve_inference_pb2 as", "from . import kserve_inference_pb2 as")
    )
    assert (tmp_path / "kserve_inference_pb2.py").read_text() == (PROTO_DIR / "kserve_inference_pb2.py").read_text(), (
        "gateway/kserve/proto is stale: run gateway/kserve/proto/generate.sh"
    )
    assert fresh_grpc == (PROTO_DIR / "kserve_inference_pb2_grpc.py").read_text()

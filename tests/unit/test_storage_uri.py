"""Storage URIs: the one parser, what each location field accepts, and errors that name the field path."""

from __future__ import annotations

import pytest

from llmfleet.api import ManifestError, parse_resource
from llmfleet.api.storage import StorageUri, UriError, parse_uri


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("pvc://models/llama/8b", StorageUri(scheme="pvc", location="models", path="llama/8b")),
        ("pvc://models", StorageUri(scheme="pvc", location="models")),
        ("s3://my-bucket/a/b/", StorageUri(scheme="s3", location="my-bucket", path="a/b")),
        ("s3://my.bucket", StorageUri(scheme="s3", location="my.bucket")),
        ("hf://meta-llama/Llama-3.1-8B@main", StorageUri(scheme="hf", location="meta-llama/Llama-3.1-8B", revision="main")),
        ("hf://gpt2", StorageUri(scheme="hf", location="gpt2")),
        ("/models/x", StorageUri(scheme="local", path="/models/x")),
        ("./rel/x", StorageUri(scheme="local", path="./rel/x")),
        ("file:///models/x", StorageUri(scheme="local", path="/models/x")),
        ("tiny://tiny-llama", StorageUri(scheme="tiny", location="tiny-llama")),
    ],
)
def test_parse(raw: str, want: StorageUri) -> None:
    got = parse_uri(raw)
    assert got == want
    assert parse_uri(str(got)) == got  # the canonical form parses back


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("s3://B/x", "bucket name"),
        ("s3://ab", "bucket name"),
        ("s3://bucket/../etc", "'..'"),
        ("pvc://Bad_Claim/x", "PersistentVolumeClaim name"),
        ("pvc://claim/a/../../b", "'..'"),
        ("hf://a/b/c", "repository id"),
        ("hf://org/name@", "bad revision"),
        ("gs://bucket/x", "unknown scheme 'gs'"),
        ("file://relative", "absolute path"),
        ("", "empty"),
    ],
)
def test_bad_uris(raw: str, needle: str) -> None:
    with pytest.raises(UriError, match=needle):
        parse_uri(raw)


def _isvc(model_path: str, student_path: str = "/m") -> dict[str, object]:
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "x"},
            "spec": {"model": {"path": model_path},
                     "fallback": {"pools": [{"name": "small", "model": {"path": student_path}}]}}}


def _tj(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {"model": {}, "data": {"path": "/data"}}
    base.update(spec)
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"}, "spec": base}


def test_errors_name_the_field_path() -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(_isvc("/ok", "s3://NO/x"))
    ((path, msg),) = info.value.problems
    assert path == "spec.fallback.pools[0].model.path" and "bucket name" in msg


@pytest.mark.parametrize(
    ("spec", "path", "needle"),
    [
        ({"data": {"path": "hf://org/data"}}, "spec.data.path", "hf:// is not accepted here"),
        ({"data": {"path": "tiny://x"}}, "spec.data.path", "tiny:// is not accepted here"),
        ({"distillation": {"teacher": "s3://NO/x"}}, "spec.distillation.teacher", "bucket name"),
        ({"output": {"path": "hf://org/out"}}, "spec.output.path", "hf:// is not accepted here"),
        ({"output": {"path": "/models/out", "promoteTo": {"inferenceService": "chat"}}}, "spec",
         "output.path '/models/out': promoteTo hands this location to the serving pool, so it must be pvc://"),
        ({"storage": {"s3": {"endpoint": "minio:9000"}}}, "spec.storage.s3.endpoint", "pattern"),
    ],
)
def test_trainingjob_location_fields(spec: dict[str, object], path: str, needle: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_resource(_tj(**spec))
    assert [p for p, _ in info.value.problems] == [path]
    assert needle in info.value.problems[0][1]


def test_accepted_locations_round_trip() -> None:
    tj = parse_resource(_tj(
        data={"path": "s3://data-bkt/tokens", "tokenizer": "hf://org/tok@v2"},
        distillation={"teacher": "pvc://models/teacher"},
        output={"path": "s3://out-bkt/run1", "promoteTo": {"inferenceService": "chat"}},
        storage={"s3": {"endpoint": "http://minio:9000", "credentialsSecret": "s3", "addressingStyle": "path"},
                 "hf": {"tokenSecret": "hf"}, "cache": {"claim": "cache"}},
    ))
    wire = tj.to_wire()
    assert wire["spec"]["data"]["path"] == "s3://data-bkt/tokens"
    assert wire["spec"]["storage"]["s3"]["credentialsSecret"] == "s3"
    assert parse_resource(wire) == tj
    isvc = parse_resource(_isvc("hf://Qwen/Qwen2.5-7B-Instruct@main", "tiny://tiny-llama"))
    assert isvc.to_wire()["spec"]["model"]["path"] == "hf://Qwen/Qwen2.5-7B-Instruct@main"


def test_the_api_server_refuses_promoting_a_local_folder() -> None:
    """The CRD's CEL rule on TrainingJob.spec says what the pydantic check says (full models only)."""
    from pathlib import Path

    import celpy
    import yaml

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "llmfleet.io_trainingjobs.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    (rule,) = [r["rule"] for r in spec_schema["x-kubernetes-validations"] if "promoteTo" in r["rule"]]
    env = celpy.Environment()
    program = env.program(env.compile(rule))

    def allowed(spec: dict[str, object]) -> bool:
        return bool(program.evaluate({"self": celpy.json_to_cel(spec)}))

    promote = {"inferenceService": "chat"}
    assert not allowed({"method": "full", "output": {"path": "/models/out", "promoteTo": promote}})
    assert allowed({"method": "full", "output": {"path": "pvc://models/out", "promoteTo": promote}})
    assert allowed({"method": "full", "output": {"path": "s3://bkt/out", "promoteTo": promote}})
    assert allowed({"method": "full", "output": {"path": "/models/out"}})
    assert allowed({"method": "lora", "output": {"path": "/adapters/a", "promoteTo": promote}})

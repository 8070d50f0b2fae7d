"""FlashInfer's load-time metadata rule, as fi-cache applies it to a target environment."""

from __future__ import annotations

from fi_cache.model.fingerprint import Fingerprint, compare_metadata

H200 = {
    "flashinfer_version": "0.6.18",
    "cuda_version": "13.0",
    "cublas_version": "13.1.0",
    "cudnn_version": "91900",
    "cudnn_frontend_version": "1.32.0",
    "gpu": "NVIDIA H200",
}


def test_same_environment_matches() -> None:
    assert compare_metadata(H200, Fingerprint.from_metadata(H200)) == []


def test_h100_target_hard_mismatches_an_h200_file() -> None:
    target = Fingerprint.from_metadata({**H200, "gpu": "NVIDIA H100 80GB HBM3"})
    [m] = compare_metadata(H200, target)
    assert (m.field, m.saved, m.target, m.hard) == (
        "gpu",
        "NVIDIA H200",
        "NVIDIA H100 80GB HBM3",
        True,
    )


def test_indeterminate_saved_value_is_soft_and_wildcard_matches() -> None:
    target = Fingerprint.from_metadata(H200)
    found = compare_metadata({**H200, "cudnn_version": "unknown", "gpu": "*"}, target)
    assert [(m.field, m.hard) for m in found] == [("cudnn_version", False)]
    missing = {k: v for k, v in H200.items() if k != "cublas_version"}
    assert [(m.field, m.hard) for m in compare_metadata(missing, target)] == [
        ("cublas_version", False)
    ]


def test_fields_the_target_does_not_know_are_not_compared() -> None:
    target = Fingerprint(flashinfer_version="0.6.18")  # e.g. a CPU-only box
    assert compare_metadata(H200, target) == []
    assert compare_metadata(H200, Fingerprint(flashinfer_version="0.6.17"))[0].hard


def test_file_without_metadata_fits_anything() -> None:
    assert compare_metadata(None, Fingerprint.from_metadata(H200)) == []


def test_namespace_digest_separates_every_field() -> None:
    base = Fingerprint.from_metadata(H200, arch="90a")
    variants = [
        base.replace(gpu="NVIDIA H100 80GB HBM3"),
        base.replace(cublas_version="13.0.2"),
        base.replace(arch="100a"),
        base.replace(cutlass_dsl_version="4.3"),
    ]
    digests = {base.digest("fused"), base.digest("unfused"), *(v.digest("fused") for v in variants)}
    assert len(digests) == 6

"""The GPU table's entries agree with each other: every planner profile has the product names nodes and devices
are matched by, the MFU peak found by a device's name is the profile's, MIG profiles' names fit their slices, and
the API's description and the plan CLI name every type."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from llmfleet.api import Resources
from llmfleet.cli.main import app
from llmfleet.plan.hardware import GPU_PRODUCTS, GPUS, MIG_PROFILES, bf16_peak_tflops, get_gpu, mig_slice

GB_PER_GIB = 2**30 / 1e9


@pytest.mark.parametrize("gpu_type", sorted(GPUS))
def test_every_profile_has_product_names_whose_mfu_peak_is_the_profiles(gpu_type: str) -> None:
    products = GPU_PRODUCTS[gpu_type]
    assert products, gpu_type
    for product in products:
        # MFU looks the peak up by torch's device name: a longer type's key must not shadow it (GB200 vs B200)
        assert bf16_peak_tflops(product) == GPUS[gpu_type].bf16_tflops, product
    assert gpu_type in Resources.model_fields["gpu_type"].description  # type: ignore[operator]


def test_superchips_are_not_read_as_their_smaller_names() -> None:
    assert bf16_peak_tflops("NVIDIA GB200") == 2500.0 and bf16_peak_tflops("NVIDIA B200") == 2250.0
    assert bf16_peak_tflops("NVIDIA L40S") == 362.0 and bf16_peak_tflops("NVIDIA L4") == 121.0


@pytest.mark.parametrize("gpu_type", sorted(MIG_PROFILES))
def test_mig_profile_names_fit_the_slices_they_describe(gpu_type: str) -> None:
    gpu = GPUS[gpu_type]
    for profile, (compute, _memory) in MIG_PROFILES[gpu_type].items():
        m = re.fullmatch(r"([1-7])g\.([0-9]+)gb", profile)
        assert m and int(m.group(1)) == compute, profile
        # the name's GB is the datasheet's share of the HBM; the driver reports a little less
        named_gb, sliced_gb = int(m.group(2)), mig_slice(gpu, profile).hbm_gib * GB_PER_GIB
        assert named_gb == pytest.approx(sliced_gb, rel=0.10), profile
    full = max(MIG_PROFILES[gpu_type], key=lambda p: MIG_PROFILES[gpu_type][p])
    assert mig_slice(gpu, full).gpu_share == 1.0


def test_the_newer_types_plan_and_slice() -> None:
    b200 = get_gpu("b200", mig="3g.90gb")
    assert b200.gpu_share == 0.5 and b200.hbm_bandwidth_tbs == pytest.approx(4.0)
    with pytest.raises(ValueError, match="L4 has no MIG profiles"):
        get_gpu("L4", mig="1g.10gb")
    out = CliRunner().invoke(app, ["plan", "--gpu", "B200", "--json", "-"])
    assert out.exit_code == 0, out.output
    bad = CliRunner().invoke(app, ["plan", "--gpu", "B201"])
    assert bad.exit_code != 0 and "B200, B300, L4" in bad.output

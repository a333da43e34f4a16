"""Machine facts and the measured FMA peak."""

import re

import pytest

from eqsched import machine


def test_static_facts_name_the_cpu_cores_caches_and_versions():
    facts = machine.facts()
    assert facts["cpu_model"] and facts["llvm_cpu_name"]
    assert "+" in facts["llvm_cpu_features"] or "-" in facts["llvm_cpu_features"]
    assert 1 <= facts["usable_cores"] <= facts["cores"]
    versions = facts["versions"]
    assert {"python", "llvm", "numpy", "llvmlite", "egglog", "eqsched"} <= set(versions)
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions["llvm"])


def test_cache_sizes_parse_sysfs_units():
    assert machine._parse_size("32K") == 32 * 1024
    assert machine._parse_size("32768K") == 32 * 1024 * 1024
    assert machine._parse_size("1M") == 1 << 20
    assert machine._parse_size("512") == 512
    caches = machine.cache_sizes()
    assert all(isinstance(v, int) and v > 0 for v in caches.values())


def test_the_peak_kernel_issues_512_bit_fmas_where_the_cpu_has_them():
    if "+avx512f" not in machine.facts()["llvm_cpu_features"]:
        pytest.skip("no AVX-512 on this CPU")
    asm = machine.fma_kernel_asm()
    assert len(re.findall(r"vfmadd\w+\s+%zmm", asm)) == machine._ACCUMULATORS


def test_peak_is_measured_once_per_process_and_is_a_positive_rate():
    small = machine.measure_peak_gflops(steps=20_000, repeats=1)
    assert small > 0
    assert machine.peak_gflops() is machine.peak_gflops()
    assert machine.describe()["peak_gflops_per_core"] == machine.peak_gflops()

"""Machine facts: the CPU, LLVM's view of it, cores, caches from sysfs, versions."""

import re

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


def test_one_reader_gives_each_caches_size_sharing_and_geometry(tmp_path):
    # A sysfs cache directory as Linux writes it: a private L1d and L1i, an L2 shared by two
    # CPUs without its geometry, and a folder that is not a cache level.
    for index, files in enumerate([
            {"level": "1", "type": "Data", "size": "48K", "shared_cpu_list": "0",
             "coherency_line_size": "64", "number_of_sets": "64", "ways_of_associativity": "12"},
            {"level": "1", "type": "Instruction", "size": "32K", "shared_cpu_list": "0"},
            {"level": "2", "type": "Unified", "size": "2048K", "shared_cpu_list": "0-1"},
            {"type": "Unified"}]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text + "\n")
    assert machine.cache_levels(tmp_path) == [
        machine.CacheLevel("L1d", 48 << 10, False, 64, 64, 12),
        machine.CacheLevel("L1i", 32 << 10, False, None, None, None),
        machine.CacheLevel("L2", 2 << 20, True, None, None, None)]
    assert machine.cache_levels(tmp_path / "absent") == []

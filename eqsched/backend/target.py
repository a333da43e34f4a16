"""Compilation targets: an LLVM CPU and feature changes, and the target machines made for them.

    Target.parse("host")             # this machine, every feature it has (the default)
    Target.parse("host,-avx512f")    # this machine with AVX-512 switched off
    Target.parse("haswell")          # an LLVM CPU name: its own features
    target.vector_bits               # 512, 256 or 128: the widest float vector it executes
    target.check_runs_here()         # TargetError unless this machine can run its code

What a named CPU can execute is not listed by LLVM's C API, so it is probed: a vector FMA is
compiled for that CPU in a child process (an unknown CPU name makes LLVM abort its process) and
the assembly says which registers and instructions it used.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass

import llvmlite.binding as llvm

from .errors import BackendError

HOST = "host"
# The instruction-set features that decide code generation for float loops, widest first.
VECTOR_FEATURES = ("avx512f", "fma", "avx2", "avx")


class TargetError(BackendError):
    """A target that is not understood, or whose code this machine cannot run."""


@functools.cache
def _initialized() -> bool:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return True


@functools.cache
def host() -> dict[str, str]:
    """CPU name, feature string and triple of this machine."""
    _initialized()
    # The name alone can be an older core than the machine (docs/ARCHITECTURE.md §17.1), so
    # the feature string is passed as well: it is what enables AVX-512.
    return {
        "cpu_name": llvm.get_host_cpu_name(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
        "triple": llvm.get_process_triple(),
    }


@functools.cache
def _host_feature_map() -> dict[str, bool]:
    _initialized()
    return dict(llvm.get_host_cpu_features())


@dataclass(frozen=True)
class Target:
    """What code is generated for: `cpu` and `features` go to LLVM as they are.

    `spec` is the normalized text the target was parsed from; it names the target in records
    and messages. `isa` is the set of VECTOR_FEATURES the target's code may use.
    """

    spec: str
    cpu: str
    features: str
    isa: frozenset[str]

    @classmethod
    def parse(cls, spec: str | None = None) -> Target:
        """A CPU ('host' or an LLVM name), then +feature/-feature changes, comma-separated."""
        return _parse(HOST if spec is None else str(spec))

    @classmethod
    def host(cls) -> Target:
        return _parse(HOST)

    @property
    def vector_bits(self) -> int:
        if "avx512f" in self.isa:
            return 512
        return 256 if "avx" in self.isa else 128

    @property
    def vector_lanes(self) -> int:
        """float32 lanes of one vector register."""
        return self.vector_bits // 32

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: AVX-512 has 32, SSE and AVX 16."""
        return 32 if "avx512f" in self.isa else 16

    @property
    def has_fma(self) -> bool:
        return "fma" in self.isa or "avx512f" in self.isa

    @property
    def key(self) -> str:
        """Short stable identity for database keys: the spec and a digest of what LLVM gets."""
        digest = hashlib.sha256(f"{self.cpu}|{self.features}".encode()).hexdigest()[:12]
        return f"{self.spec}:{digest}"

    def check_runs_here(self) -> None:
        """Refuse, before anything is compiled, a target that uses features this CPU lacks."""
        have = {name for name, on in _host_feature_map().items() if on}
        added = {change[1:] for change in self.spec.split(",")[1:] if change.startswith("+")}
        missing = sorted((self.isa | added) - have)
        if missing:
            raise TargetError(f"target {self.spec!r} needs {', '.join(missing)}, which this CPU "
                              f"({host()['cpu_name']}) does not have")

    def describe(self) -> dict[str, object]:
        return {"target": self.spec, "cpu_name": self.cpu, "cpu_features": self.features,
                "triple": host()["triple"], "vector_bits": self.vector_bits,
                "vector_registers": self.vector_registers}

    def __str__(self) -> str:
        return self.spec


@functools.cache
def _parse(spec: str) -> Target:
    parts = [p.strip() for p in spec.split(",")]
    if not parts[0] or parts[0][0] in "+-":
        raise TargetError(f"target {spec!r}: start with a CPU name ('host' or an LLVM CPU such as "
                          "'haswell'), then +feature/-feature changes")
    cpu_word, changes = parts[0].lower(), parts[1:]
    known = _host_feature_map()
    for change in changes:
        if len(change) < 2 or change[0] not in "+-":
            raise TargetError(f"target {spec!r}: {change!r} is not a feature change "
                              "(write +name or -name)")
        if change[1:] not in known:
            raise TargetError(f"target {spec!r}: {change[1:]!r} is not an x86 feature LLVM knows")
    normalized = ",".join([cpu_word, *changes])
    if cpu_word == HOST:
        features = ",".join([host()["cpu_features"], *changes])
        return Target(normalized, host()["cpu_name"], features, _host_isa(changes))
    features = ",".join(changes)
    return Target(normalized, cpu_word, features, _probe_isa(cpu_word, features))


# Compiled for the probed CPU: which registers and instructions carry a 16-wide float FMA and
# an 8-wide integer multiply tells its vector features.
_PROBE_IR = """
define void @probe(ptr noalias %p) #0 {
  %a = load <16 x float>, ptr %p
  %b = call <16 x float> @llvm.fma.v16f32(<16 x float> %a, <16 x float> %a, <16 x float> %a)
  store <16 x float> %b, ptr %p
  %q = getelementptr float, ptr %p, i64 64
  %i = load <8 x i32>, ptr %q
  %j = mul <8 x i32> %i, %i
  store <8 x i32> %j, ptr %q
  ret void
}
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
attributes #0 = { "min-legal-vector-width"="512" }
"""


def _probe_assembly(cpu: str, features: str) -> str:
    _initialized()
    module = llvm.parse_assembly(_PROBE_IR)
    module.triple = host()["triple"]
    target = llvm.Target.from_triple(host()["triple"])
    return target.create_target_machine(cpu=cpu, features=features, opt=2).emit_assembly(module)


def _isa_of_assembly(asm: str) -> frozenset[str]:
    isa = set()
    if "zmm" in asm:
        isa.add("avx512f")
    if "vfmadd" in asm:
        isa.add("fma")
    if "ymm" in asm or "zmm" in asm:
        isa.add("avx")
    if "vpmulld\t%ymm" in asm or "vpmulld\t%zmm" in asm:
        isa.add("avx2")
    return frozenset(isa)


def _host_isa(changes: list[str]) -> frozenset[str]:
    """The host's vector features after `changes`, applied in order as LLVM applies them."""
    flags = dict(_host_feature_map())
    for change in changes:
        flags[change[1:]] = change[0] == "+"
    isa = {f for f in VECTOR_FEATURES if flags.get(f)}
    # LLVM clears what depends on a feature switched off: AVX-512 needs AVX2 and FMA, those AVX.
    if "avx" not in isa:
        isa -= {"avx2", "fma", "avx512f"}
    if not {"avx2", "fma"} <= isa:
        isa.discard("avx512f")
    return frozenset(isa)


@functools.cache
def _probe_isa(cpu: str, features: str) -> frozenset[str]:
    result = subprocess.run([sys.executable, "-m", "eqsched.backend.target", cpu, features],
                            capture_output=True, text=True, timeout=120)
    if "not a recognized processor" in result.stderr:
        raise TargetError(f"target {cpu!r}: LLVM knows no x86 CPU of that name (try 'host', "
                          "'haswell', 'skylake-avx512', 'znver4')")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise TargetError(f"target {cpu!r}: LLVM could not compile for it: {last}")
    return frozenset(json.loads(result.stdout))


def create_target_machine(opt_level: int, target: Target | None = None) -> llvm.TargetMachine:
    """A new target machine (an execution engine takes ownership of the one it gets)."""
    _initialized()
    target = target or Target.host()
    llvm_target = llvm.Target.from_triple(host()["triple"])
    return llvm_target.create_target_machine(cpu=target.cpu, features=target.features,
                                             opt=opt_level, codemodel="jitdefault")


@functools.cache
def target_machine(opt_level: int, target: Target | None = None) -> llvm.TargetMachine:
    """The shared target machine for optimization and assembly printing."""
    return create_target_machine(opt_level, target)


if __name__ == "__main__":
    # The probe's child process: prints the vector features the CPU's code uses.
    print(json.dumps(sorted(_isa_of_assembly(_probe_assembly(sys.argv[1], sys.argv[2])))))

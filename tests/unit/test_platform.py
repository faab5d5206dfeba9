import pytest
import torch

from ftlab import platform as ftplatform

EXPECTED = {
    # arch: (kind, family, wave size, uma)
    "gfx1100": ("rocm", "RDNA3", 32, False),
    "gfx1101": ("rocm", "RDNA3", 32, False),
    "gfx1102": ("rocm", "RDNA3", 32, False),
    "gfx1150": ("rocm", "RDNA3.5", 32, True),
    "gfx1151": ("rocm", "RDNA3.5", 32, True),
    "gfx1200": ("rocm", "RDNA4", 32, False),
    "gfx1201": ("rocm", "RDNA4", 32, False),
    "gfx90a": ("rocm", "CDNA2", 64, False),
    "gfx942": ("rocm", "CDNA3", 64, False),
    "sm_80": ("cuda", "Ampere", 32, False),
    "sm_86": ("cuda", "Ampere", 32, False),
    "sm_89": ("cuda", "Ada", 32, False),
    "sm_90": ("cuda", "Hopper", 32, False),
}


def test_every_table_arch_is_tested():
    assert set(EXPECTED) == set(ftplatform.ARCHS)


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_faked_arch(arch, monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", arch)
    plat = ftplatform.current()
    kind, family, wave, uma = EXPECTED[arch]
    assert (plat.kind, plat.family, plat.wave_size, plat.uma) == (kind, family, wave, uma)
    assert plat.arch == arch and plat.faked and plat.is_gpu
    assert arch in plat.describe()


@pytest.mark.parametrize(
    "name, gfx",
    [
        ("gfx1100:sramecc-:xnack-", "gfx1100"),
        ("gfx942:sramecc+:xnack-", "gfx942"),
        ("gfx1151", "gfx1151"),
        ("gfx90a:xnack+", "gfx90a"),
        ("GFX1201", "gfx1201"),
    ],
)
def test_parse_gcn_arch_name(name, gfx):
    assert ftplatform.parse_gfx(name) == gfx


def test_faked_gcn_arch_name_with_features(monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", "gfx1151:sramecc-:xnack-")
    plat = ftplatform.current()
    assert (plat.arch, plat.family, plat.uma) == ("gfx1151", "RDNA3.5", True)


def test_unknown_gfx_keeps_wave_rule(monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", "gfx908")
    plat = ftplatform.current()
    assert plat.is_rocm and plat.info is None and plat.wave_size == 64
    monkeypatch.setenv("FTLAB_ARCH", "gfx1103")
    assert ftplatform.current().wave_size == 32


@pytest.mark.parametrize("bad", ["", "mi300", "sm", "gpu0", "cuda"])
def test_bad_arch_is_a_clear_error(bad, monkeypatch):
    with pytest.raises(ValueError, match="FTLAB_ARCH|gcnArchName"):
        ftplatform.platform_from_arch(bad)


def test_cpu_device_is_cpu_even_when_faked(monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", "gfx1201")
    assert ftplatform.current(torch.device("cpu")).kind == "cpu"
    assert ftplatform.current("cpu").kind == "cpu"


def test_sm_spellings():
    assert ftplatform.platform_from_arch("sm90").arch == "sm_90"
    assert ftplatform.platform_from_arch("sm_90a").sm == 90


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only machine check")
def test_detected_without_gpu(monkeypatch):
    monkeypatch.delenv("FTLAB_ARCH", raising=False)
    assert ftplatform.current().kind == "cpu"


@pytest.mark.gpu
def test_detected_gpu(monkeypatch):
    monkeypatch.delenv("FTLAB_ARCH", raising=False)
    plat = ftplatform.current()
    assert plat.is_gpu and plat.arch and plat.wave_size in (32, 64)
    if torch.version.hip:
        assert plat.kind == "rocm" and plat.arch.startswith("gfx")
    else:
        major, minor = torch.cuda.get_device_capability()
        assert plat.sm == major * 10 + minor

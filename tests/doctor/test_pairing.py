"""The torch <-> torch-npu <-> CANN pairing table, the findings it drives, and the copy of it on the site (reference/error-codes.md)."""

from __future__ import annotations

import pytest

from npu_port.doctor import checks_ascend, pairing
from npu_port.doctor.cann import CannInstall
from npu_port.doctor.facts import Facts
from npu_port.doctor.finding import Finding
from npu_port.doctor.probes import major_minor, release_tuple
from npu_port.doctor.report import as_json
from npu_port.doctor.run import DoctorResult


def facts_with(torch_version, npu_version, cann_version=None) -> Facts:
    facts = Facts(environ={})
    facts.torch_version, facts.torch_npu_version = torch_version, npu_version
    facts.cann = CannInstall("/usr/local/Ascend/ascend-toolkit/latest", "$ASCEND_HOME_PATH", cann_version, None)
    return facts


# --- the table itself ------------------------------------------------------------------------------------------------


def test_each_torch_npu_release_pairs_with_its_own_torch_series_newest_first():
    series = [release_tuple(row.series) for row in pairing.PAIRINGS]
    assert series == sorted(series, reverse=True)
    for row in pairing.PAIRINGS:
        if row.torch_npu is not None:
            assert major_minor(row.torch_npu) == row.series, row
            assert row.cann is not None
    assert len({row.torch_npu for row in pairing.PAIRINGS}) == len(pairing.PAIRINGS)


def test_the_newest_rows_torch_2_15_without_torch_npu_and_2_14_2_13_with_cann_9_1_inferred():
    newest = pairing.PAIRINGS[:4]
    assert [row.as_dict() for row in newest] == [
        {"torch": "2.15.0", "torch_npu": None, "cann": None, "cann_inferred": False, "source": pairing.PYPI},
        {"torch": "2.14.0", "torch_npu": "2.14.0", "cann": "9.1.x", "cann_inferred": True, "source": pairing.SUPPORT},
        {"torch": "2.13.0", "torch_npu": "2.13.0", "cann": "9.1.x", "cann_inferred": True, "source": pairing.SUPPORT},
        {
            "torch": "2.12.0",
            "torch_npu": "2.12.0",
            "cann": "9.1.0",
            "cann_inferred": False,
            "source": pairing.COMPATIBILITY,
        },
    ]
    assert pairing.newest_release().torch_npu == "2.14.0"
    # Only the two releases Ascend has not tabulated yet are inferred.
    assert [row.torch_npu for row in pairing.PAIRINGS if row.cann_inferred] == ["2.14.0", "2.13.0"]


@pytest.mark.parametrize(
    "installed, row",
    [
        ("2.14.0", "2.14.0"),
        ("2.9.0.post2", "2.9.0.post2"),
        ("2.9.0.post2+git1234", "2.9.0.post2"),
        ("2.12.0.post3", "2.12.0"),  # on PyPI, not in Ascend's table: its series' newest row
        ("2.9.1", "2.9.0.post6"),
        ("1.11.0", None),
        (None, None),
    ],
)
def test_the_row_of_an_installed_torch_npu(installed, row):
    found = pairing.pairing_of(installed)
    assert (found.torch_npu if found else None) == row


@pytest.mark.parametrize(
    "torch_version, pip_arguments",
    [
        ("2.13.0+cpu", '"torch-npu==2.13.*"'),
        ("2.14.0", '"torch-npu==2.14.*"'),
        ("2.15.0", '"torch==2.14.*" "torch-npu==2.14.*"'),
        ("2.16.0.dev20261201", '"torch==2.14.*" "torch-npu==2.14.*"'),
        ("2.2.0", '"torch-npu==2.2.*"'),  # older than the table: the same-series rule still holds
        (None, "torch-npu of the same major.minor as torch"),
    ],
)
def test_pip_arguments_for_a_working_pair(torch_version, pip_arguments):
    assert pairing.pip_pair(torch_version) == pip_arguments


@pytest.mark.parametrize(
    "found, listed, match",
    [
        ("8.1.RC1", "8.1.RC1", True),
        ("8.1.rc1", "8.1.RC1", True),
        ("9.1.0", "9.1.x", True),
        ("9.1.0.beta1", "9.1.0", True),
        ("9.10.0", "9.1.x", False),
        ("9.0.0", "9.1.0", False),
        ("8.5.0", "8.5.0.1", False),
    ],
)
def test_cann_versions_match_the_listed_release_or_family(found, listed, match):
    assert pairing.cann_matches(found, listed) is match


# --- findings --------------------------------------------------------------------------------------------------------


def test_torch_2_15_without_torch_npu_is_told_to_use_the_2_14_pair():
    (finding,) = checks_ascend.check_torch_npu(facts_with("2.15.0", None))
    assert finding.status == "info"
    assert finding.fix == (
        'on Ascend: install CANN, source its set_env.sh, then pip install "torch==2.14.*" "torch-npu==2.14.*" '
        "(torch 2.15 has no torch-npu release yet, checked 2026-11-23)"
    )


def test_torch_2_15_with_torch_npu_2_14_is_a_pairing_error_that_says_why():
    (finding,) = checks_ascend.check_torch_npu_pairing(facts_with("2.15.0", "2.14.0"))
    assert finding.status == "error"
    assert finding.summary == (
        "torch 2.15.0 does not pair with torch_npu 2.14.0 (the major.minor must match) "
        "(torch 2.15 has no torch-npu release yet, checked 2026-11-23)"
    )
    assert finding.fix == (
        'pip install "torch==2.14.*" "torch-npu==2.14.*", or pin torch to match: pip install "torch==2.14.*"'
    )


@pytest.mark.parametrize(
    "npu_version, cann_version, status, summary, fix",
    [
        ("2.12.0", "9.1.0", "ok", "CANN 9.1.0 is the one listed for torch-npu 2.12.0", None),
        ("2.14.0", "9.1.0", "ok", "CANN 9.1.0 is the one listed for torch-npu 2.14.0", None),
        ("2.12.0.post3", "9.1.0", "ok", "CANN 9.1.0 is the one listed for torch-npu 2.12.0 (its series)", None),
        (
            "2.9.0.post6",
            "8.5.0",
            "warn",
            "CANN 8.5.0 found, but torch-npu 2.9.0.post6 is listed with CANN 9.1.0",
            'install CANN 9.1.0, or pip install "torch-npu==2.9.0" (listed for CANN 8.5.0)',
        ),
        (
            "2.12.0",
            "8.3.RC1",
            "warn",
            "CANN 8.3.RC1 found, but torch-npu 2.12.0 is listed with CANN 9.1.0",
            "install CANN 9.1.0",
        ),
        (
            "2.14.0",
            "8.5.0",
            "info",
            "CANN 8.5.0 found; torch-npu 2.14.0 is expected with CANN 9.1.x (inferred): Ascend lists no CANN for it yet",
            "install CANN 9.1.x",
        ),
        ("2.13.0", None, "info", "CANN version unknown; torch-npu 2.13.0 is listed with CANN 9.1.x (inferred)", None),
        (
            "1.11.0",
            "8.0.RC2",
            "info",
            "torch_npu 1.11.0 is not in npu-port's pairing table; CANN found: 8.0.RC2",
            f"use the CANN version Ascend lists for torch-npu 1.11.0: {pairing.COMPATIBILITY}",
        ),
    ],
)
def test_the_cann_found_against_the_one_listed_for_torch_npu(npu_version, cann_version, status, summary, fix):
    (finding,) = checks_ascend.check_torch_npu_cann(facts_with("2.13.0", npu_version, cann_version))
    assert (finding.check, finding.status, finding.summary, finding.fix) == ("torch-npu-cann", status, summary, fix)
    assert finding.details["cann_found"] == cann_version


def test_no_torch_npu_means_no_cann_pairing_finding():
    assert checks_ascend.check_torch_npu_cann(facts_with("2.13.0", None, "9.1.0")) == []


# --- where the table is shown ----------------------------------------------------------------------------------------


def test_the_json_report_carries_the_table():
    report = as_json(DoctorResult((("g", (Finding("a", "A", "ok", "fine"),)),)))
    assert report["torch_npu_pairings"] == [row.as_dict() for row in pairing.PAIRINGS]
    assert report["torch_npu_pairings"][1]["torch_npu"] == "2.14.0"


def test_the_site_shows_the_table_as_generated():
    from ..docs import site

    assert "reference/error-codes.md" in site.pages_with("torch-npu-pairing")
    assert site.hook().render("torch-npu-pairing") == pairing.markdown_table()
    assert "| `2.15.0` | none yet (checked 2026-11-23) | - |" in pairing.markdown_table()
    assert "| `2.14.0` | `2.14.0` | CANN 9.1.x (inferred) |" in pairing.markdown_table()

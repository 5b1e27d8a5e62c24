"""What a rolling run does after its preflight: a deploy refuses on any host it cannot check, a rollback goes on
without the unreachable (and their node groups), and every host held back has a record that says why."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.filter import preflight_verdict as verdict_filter

HOSTS = ["h1", "h2", "h3"]


def preflight_verdict(hosts, state, purpose, require_all_reachable=False):
    """The filter, given each host's state as the playbook's facts say it."""
    answers = {
        host: {
            "before": {} if value.get("passed") else None,
            "refusal": value.get("refusal"),
            "node_group": value.get("node_group"),
        }
        for host, value in state.items()
    }
    return verdict_filter.preflight_verdict(hosts, answers, purpose, require_all_reachable=require_all_reachable)


ALL_PASSED = {host: {"passed": True} for host in HOSTS}


def test_nothing_held_back_when_every_host_passed():
    for purpose in ("deploy", "rollback"):
        verdict = preflight_verdict(HOSTS, ALL_PASSED, purpose)
        assert verdict == {"go": HOSTS, "refused": False, "note": "", "records": {}}


def test_a_deploy_with_an_unreachable_host_is_refused_and_every_host_says_nothing_changed():
    verdict = preflight_verdict(HOSTS, {"h1": {"passed": True}, "h2": {"passed": True}}, "deploy")
    assert verdict["refused"] is True and verdict["go"] == []
    assert verdict["note"] == "REFUSED at preflight, nothing changed on any host: h3 unreachable"
    assert verdict["records"]["h3"]["outcome"] == "unreachable"
    for host in ("h1", "h2"):
        assert verdict["records"][host] == {
            "outcome": "refused",
            "detail": "nothing changed: the deploy was refused at preflight (h3 unreachable)",
        }


def test_a_host_that_failed_its_preflight_refuses_a_rollback_too_naming_why():
    state = {**ALL_PASSED, "h2": {"passed": False, "refusal": "no previous known-good snapshot"}}
    verdict = preflight_verdict(HOSTS, state, "rollback")
    assert verdict["refused"] is True and verdict["go"] == []
    assert "h2 failed its preflight: no previous known-good snapshot" in verdict["note"]
    assert verdict["records"]["h2"]["detail"].startswith("failed its preflight (no previous known-good snapshot)")


def test_a_rollback_goes_on_without_the_unreachable_and_names_them():
    verdict = preflight_verdict(HOSTS, {"h1": {"passed": True}, "h3": {"passed": True}}, "rollback")
    assert verdict["refused"] is False and verdict["go"] == ["h1", "h3"]
    assert verdict["records"] == {
        "h2": {
            "outcome": "skipped",
            "detail": "unreachable at preflight: not rolled back (see its error above); run again when it is back",
        }
    }
    assert verdict["note"].startswith("SKIPPED 1 host(s), left as they were: h2")


def test_a_rollback_skips_a_node_group_with_an_unreachable_member_whole():
    group = ["h1", "h2"]
    state = {"h1": {"passed": True, "node_group": group}, "h3": {"passed": True, "node_group": []}}
    verdict = preflight_verdict(HOSTS, state, "rollback")
    assert verdict["go"] == ["h3"]
    assert verdict["records"]["h1"] == {
        "outcome": "skipped",
        "detail": "not rolled back: its node group's h2 unreachable, and a group returns whole",
    }
    assert verdict["records"]["h2"]["outcome"] == "skipped"
    assert "h1, h2" in verdict["note"]


def test_require_all_reachable_restores_the_refusal_of_a_rollback():
    verdict = preflight_verdict(HOSTS, {"h1": {"passed": True}}, "rollback", require_all_reachable=True)
    assert verdict["refused"] is True and verdict["go"] == []
    assert verdict["note"] == "REFUSED at preflight, nothing changed on any host: h2 unreachable; h3 unreachable"


def test_no_host_reached():
    verdict = preflight_verdict(HOSTS, {}, "rollback")
    assert verdict["go"] == [] and set(verdict["records"]) == set(HOSTS)


def test_an_unknown_purpose_is_refused():
    with pytest.raises(AnsibleFilterError, match="purpose must be deploy or rollback, got 'sweep'"):
        preflight_verdict(HOSTS, ALL_PASSED, "sweep")

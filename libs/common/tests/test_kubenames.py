"""``kube.names``: the one DNS-1123 check (the batch binder's Bindings, `agmarl up`'s cluster and scheduler
names), as apimachinery's IsDNS1123Label / IsDNS1123Subdomain."""
from __future__ import annotations

import pytest

from agmarl_common.kube.names import InvalidName, check_name, is_dns1123

LABEL_CASES = [  # (value, a label, a subdomain)
    ("default", True, True),
    ("a", True, True),
    ("node-0", True, True),
    ("0abc9", True, True),
    ("a" * 63, True, True),
    ("a" * 64, False, True),  # too long for a label; a subdomain's label may be (only the whole is bounded)
    ("node-0.zone-a", False, True),
    ("a" * 253, False, True),
    ("a" * 254, False, False),  # too long
    ("", False, False),  # empty
    ("Default", False, False),  # uppercase
    ("node_0", False, False),  # bad characters
    ("a b", False, False),
    ("p/../x", False, False),
    ("-a", False, False),  # starts or ends with '-'
    ("a-", False, False),
    ("a..b", False, False),  # an empty label
    (".a", False, False),
    ("abc\n", False, False),  # a trailing newline (a `$` anchor let it through)
    (None, False, False),  # not a string
    (7, False, False),
]


@pytest.mark.parametrize("value, label, subdomain", LABEL_CASES)
def test_labels_and_subdomains(value, label, subdomain):
    assert is_dns1123(value) is label
    assert is_dns1123(value, "label") is label
    assert is_dns1123(value, "subdomain") is subdomain


@pytest.mark.parametrize("what, value, ok", [
    ("namespace", "kube-system", True), ("namespace", "a.b", False), ("namespace", "n" * 64, False),
    ("pod", "web-0.x", True), ("pod", "Web", False), ("pod", "", False),
    ("node", "ip-10-0-0-1.ec2.internal", True), ("node", "a b", False),
])
def test_check_name_returns_the_name_or_says_what_is_wrong(what, value, ok):
    if ok:
        assert check_name(what, value) == value
        return
    with pytest.raises(InvalidName, match=f"invalid {what} name"):
        check_name(what, value)
    assert issubclass(InvalidName, ValueError)


def test_an_unknown_kind_of_name_is_a_bug():
    with pytest.raises(KeyError):
        check_name("deployment", "web")

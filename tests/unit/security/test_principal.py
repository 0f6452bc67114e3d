"""ssl.principal.mapping.rules as Kafka documents them (Security: "Customizing SSL User Name")."""

from __future__ import annotations

import pytest

from gregor.common.principal import DEFAULT_RULES, PrincipalMappingError, parse_rules, principal_for

KAFKA_DOC_RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
                   "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
                   "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
                   "DEFAULT")


@pytest.mark.parametrize("dn, principal", [
    ("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "User:serviceuser"),
    ("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "User:adminuser@admin"),
    ("OU=x,cn=Billing.App", "User:billing.app"),
    ("O=NoCommonName", "User:O=NoCommonName"),
])
def test_kafkas_documented_examples(dn: str, principal: str) -> None:
    assert principal_for(dn, parse_rules(KAFKA_DOC_RULES)) == principal


def test_default_is_the_whole_dn_and_upper_case_flag() -> None:
    assert principal_for("CN=billing,O=Example", parse_rules(DEFAULT_RULES)) == "User:CN=billing,O=Example"
    assert principal_for("CN=billing", parse_rules("RULE:^CN=(.*)$/$1/U")) == "User:BILLING"


def test_no_matching_rule_and_bad_rules_are_errors() -> None:
    with pytest.raises(PrincipalMappingError, match="No rules apply"):
        principal_for("O=x", parse_rules("RULE:^CN=(.*)$/$1/"))
    for bad in ("RULE:^CN=(.*)$/$1", "NOTARULE", "RULE:(unclosed/$1/", ""):
        with pytest.raises(PrincipalMappingError):
            parse_rules(bad)

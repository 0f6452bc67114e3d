"""`ssl.principal.mapping.rules`: Kafka's SSL principal mapping from a certificate's subject to a user name.

The rules are a comma-separated list tried in order; the first that matches the subject's distinguished
name (RFC 2253 form, most specific first: `CN=billing,OU=apps,O=Example`) gives the name:

- `RULE:pattern/replacement/` with an optional `L` or `U` after the last slash (lower or upper case the
  result); `$1`, `$2` ... in the replacement are the pattern's groups; the pattern must match the whole DN;
- `DEFAULT`: the whole DN.

Without a matching rule the mapping fails (Kafka refuses the connection). The principal is `User:` + name.
Concurrency: none (pure functions over immutable rules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

DEFAULT_RULES = "DEFAULT"
_RULE = re.compile(r"\s*RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)\s*(?:,|$)|\s*DEFAULT\s*(?:,|$)")


class PrincipalMappingError(ValueError):
    """The rules do not parse, or no rule matches a subject."""


@dataclass(frozen=True)
class Rule:
    pattern: Optional[re.Pattern[str]]  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> Optional[str]:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        name = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))) or "", self.replacement)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


def parse_rules(text: str = DEFAULT_RULES) -> list[Rule]:
    rules: list[Rule] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None or m.end() == pos:
            raise PrincipalMappingError(f"Invalid rule: {text[pos:]!r} in ssl.principal.mapping.rules")
        if m.group(0).strip().rstrip(",").strip() == "DEFAULT":
            rules.append(Rule(None))
        else:
            try:
                pattern = re.compile(m.group(1).replace("\\/", "/"))
            except re.error as exc:
                raise PrincipalMappingError(f"Invalid rule pattern {m.group(1)!r}: {exc}") from None
            rules.append(Rule(pattern, m.group(2).replace("\\/", "/"), m.group(3)))
        pos = m.end()
    if not rules:
        raise PrincipalMappingError("ssl.principal.mapping.rules is empty")
    return rules


def principal_for(dn: str, rules: list[Rule]) -> str:
    """`User:<name>` for the certificate subject `dn` (RFC 2253), by the first rule that matches."""
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return f"User:{name}"
    raise PrincipalMappingError(f"No rules apply to {dn}, rules {[r.pattern.pattern if r.pattern else 'DEFAULT' for r in rules]}")

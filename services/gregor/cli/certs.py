"""`gregor certs create`: a local CA and certificates for every service and client (docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import click

from gregor.common import certs as certlib

DEFAULT_SERVICES = ("broker", "controller", "coordinator", "gateway", "etcd")


@click.group("certs")
def certs_group() -> None:
    """Make the certificates an mTLS cluster uses (gregor cluster up --tls)."""


@certs_group.command("create")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="directory for ca.crt/ca.key and NAME.crt/NAME.key")
@click.option("--service", "services", multiple=True,
              help=f"a service certificate NAME (repeatable; default: {', '.join(DEFAULT_SERVICES)})")
@click.option("--client", "clients", multiple=True, help="a client certificate NAME (repeatable), e.g. billing")
@click.option("--host", "hosts", multiple=True,
              help="a host name or IP address every certificate names as a subjectAltName "
                   f"(repeatable; default: {', '.join(certlib.DEFAULT_HOSTS)})")
@click.option("--org", default=None, help="O= in every subject")
@click.option("--days", type=click.IntRange(min=1), default=certlib.DEFAULT_DAYS, show_default=True,
              help="validity of the service and client certificates")
@click.option("--keep-ca", is_flag=True, help="sign with the CA already in --out instead of making a new one")
def create(out_dir: Path, services: tuple[str, ...], clients: tuple[str, ...], hosts: tuple[str, ...],
           org: str | None, days: int, keep_ca: bool) -> None:
    """A CA (unless --keep-ca) and one certificate per service and client, signed by it."""
    for name in (*services, *clients):
        if not name or "/" in name or name.startswith(".") or name == "ca":
            raise click.BadParameter(f"{name!r} is not a usable certificate name", param_hint="--service/--client")
    if keep_ca:
        if not (out_dir / "ca.crt").exists() or not (out_dir / "ca.key").exists():
            raise click.ClickException(f"--keep-ca: no ca.crt and ca.key in {out_dir}")
        ca_subject = certlib.subject_of((out_dir / "ca.crt").read_bytes())
    else:
        ca_subject = certlib.create_ca(out_dir, org=org).subject
    click.echo(f"CA {ca_subject}: {out_dir / 'ca.crt'}")
    for name in (services or DEFAULT_SERVICES):
        issued = certlib.issue(out_dir, name, hosts or certlib.DEFAULT_HOSTS, org=org, days=days)
        click.echo(f"service {issued.subject}: {issued.cert_path}")
    for name in clients:
        issued = certlib.issue(out_dir, name, hosts or certlib.DEFAULT_HOSTS, org=org, days=days)
        click.echo(f"client {issued.subject}: {issued.cert_path}")

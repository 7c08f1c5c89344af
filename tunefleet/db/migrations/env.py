"""Alembic environment: runs on the engine tunefleet hands over (never reads alembic.ini)."""

from __future__ import annotations

from alembic import context

from tunefleet.db.tables import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes["engine"]
    with engine.begin() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():  # pragma: no cover - offline SQL generation is not offered
    raise SystemExit("offline migrations are not supported; run `tunefleet db upgrade`")
run_migrations_online()

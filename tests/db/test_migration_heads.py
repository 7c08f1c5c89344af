"""The migrations form one line: one base, one head, every revision with one parent.

Two branches merged without a merge revision would leave two heads: ``tunefleet db upgrade``
(``alembic upgrade head``) then refuses to run, on every installation at once.
"""

from __future__ import annotations

from alembic.script import ScriptDirectory

from tunefleet.db.connection import alembic_config, head_revision


def test_alembic_has_a_single_head_and_a_linear_history() -> None:
    script = ScriptDirectory.from_config(alembic_config(None))  # type: ignore[arg-type]
    heads, bases = script.get_heads(), script.get_bases()
    assert len(heads) == 1, f"several heads: {heads}; add a merge revision"
    assert len(bases) == 1, f"several bases: {bases}"
    revisions = list(script.walk_revisions())  # from the head down to the base
    assert revisions[0].revision == heads[0] == head_revision() and revisions[-1].revision == bases[0]
    for rev in revisions[:-1]:
        assert isinstance(rev.down_revision, str), f"{rev.revision} has parents {rev.down_revision}: a merge or a second base"
    names = [rev.path.rsplit("/", 1)[-1] for rev in reversed(revisions)]
    assert names == sorted(names), f"revision files out of order: {names}"  # 0001_..., 0002_..., in order

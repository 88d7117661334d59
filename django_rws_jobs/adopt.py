"""Taking over tables that rust-web-server created first, keeping every row (tests/test_adopt.py).

The Rust crate creates ``rws_jobs`` and ``rws_job_schedules`` when it starts, in one of two forms:
before 18.35 the jobs table has rust-web-server's nine columns; from 18.36 on it also has ``queue``,
``priority`` and ``unique_key``. Neither has our columns, indexes or constraints. The initial
migration creates the tables with :class:`CreateOrAdoptModel`, which, where a table exists
already, brings it to our model instead and keeps every row:

- PostgreSQL and MySQL/MariaDB: in place. Missing columns are added (with the database defaults
  of the model, so the Rust crate's rows get ``queue = 'default'``, ``priority = 0``), 32-bit
  integer columns that the model keeps in 64 bits are widened, and the missing indexes and
  constraints are created. Column types that only differ in name (``TEXT`` for ``VARCHAR``) stay;
  MariaDB's ``TEXT`` is widened to the model's ``LONGTEXT``.
- Everywhere: the crate's waiting and running unique jobs get their key's hash, so that
  ``enqueue`` finds them.
- SQLite, which cannot add a column with a default or a constraint in place: the table is
  rebuilt in the migration's transaction, as Django's own SQLite migrations do it (renamed,
  created anew, rows copied, old table dropped).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from .api.enqueue import unique_hash
from .database.backends import backend_for


class CreateOrAdoptModel(migrations.CreateModel):
    """CreateModel, or, where the table exists already (rust-web-server's), adopt it with its rows."""

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.name)
        conn = schema_editor.connection
        if self.allow_migrate_model(conn.alias, model):
            with conn.cursor() as cursor:
                exists = model._meta.db_table in conn.introspection.table_names(cursor)
            if exists:
                adopt(schema_editor, model)
                return
        super().database_forwards(app_label, schema_editor, from_state, to_state)


def adopt(schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model]) -> None:
    """Bring an existing table to ``model``'s columns, indexes and constraints, keeping its rows."""
    conn = schema_editor.connection
    table = model._meta.db_table
    with conn.cursor() as cursor:
        columns = {col.name: col for col in conn.introspection.get_table_description(cursor, table)}
    fields = model._meta.local_concrete_fields
    unknown = set(columns) - {f.column for f in fields}
    if unknown:
        raise RuntimeError(
            f"cannot adopt table {table!r}: it has columns the model does not know: "
            f"{', '.join(sorted(unknown))} (expected rust-web-server's form of the table)"
        )
    if backend_for(conn).features.adopts_by_rebuild:
        _rebuild(schema_editor, model, [f.column for f in fields if f.column in columns])
        _hash_unique_keys(schema_editor, model)
        return
    for field in fields:
        if field.column not in columns:
            schema_editor.add_field(model, field)
        elif field.get_internal_type() == "BigIntegerField" and _is_32_bit(conn, columns[field.column]):
            schema_editor.alter_field(
                model, _as_stored(field, model, models.IntegerField), field, strict=False
            )
        elif field.get_internal_type() == "TextField" and _is_narrow_text(columns[field.column]):
            schema_editor.alter_field(model, _as_stored(field, model, _NarrowText), field, strict=False)
    with conn.cursor() as cursor:
        existing = conn.introspection.get_constraints(cursor, table)
    for index in model._meta.indexes:
        if index.name not in existing:
            schema_editor.add_index(model, index)
    for constraint in model._meta.constraints:
        if constraint.name not in existing:
            schema_editor.add_constraint(model, constraint)
    _hash_unique_keys(schema_editor, model)


def _hash_unique_keys(schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model]) -> None:
    """Give the crate's waiting and running unique jobs the key hash that our enqueue checks, so
    that it does not add a second job of the same key: per key, the running job, else the
    earliest (tests/test_adopt.py::test_migrate_adopts_a_table_rust_created_and_keeps_every_row)."""
    if "unique_hash" not in {f.column for f in model._meta.local_concrete_fields}:
        return  # rws_job_schedules

    q = schema_editor.quote_name
    table = q(model._meta.db_table)
    with schema_editor.connection.cursor() as c:
        c.execute(
            f"SELECT id, job_type, unique_key FROM {table} WHERE unique_key IS NOT NULL AND "
            "unique_hash IS NULL AND status IN ('pending', 'running') "
            "ORDER BY CASE WHEN status = 'running' THEN 0 ELSE 1 END, created_at, id"
        )
        first: dict[str, str] = {}
        for job_id, job_type, key in c.fetchall():
            first.setdefault(unique_hash(job_type, key), job_id)
        for digest, job_id in first.items():
            c.execute(f"UPDATE {table} SET unique_hash = %s WHERE id = %s", [digest, job_id])


def _is_32_bit(conn: Any, column: Any) -> bool:
    field_type = conn.introspection.get_field_type(column.type_code, column)
    return field_type in ("IntegerField", "SmallIntegerField")


def _is_narrow_text(column: Any) -> bool:
    """A text column with a size below the model's (MariaDB's TEXT holds 65,535 bytes, the model's
    LONGTEXT 4 GiB; PostgreSQL's text reports no size): a longer payload would be refused, or cut
    short where the server is not in strict mode (tests/test_adopt.py)."""
    size = getattr(column, "internal_size", None)
    return isinstance(size, int) and 0 < size < NARROW_TEXT_BELOW


#: Bytes of MariaDB/MySQL's LONGTEXT, the model's text columns there.
NARROW_TEXT_BELOW = 2**32 - 1


class _NarrowText(models.TextField):
    def db_type(self, connection: Any) -> str:
        return "text"


def _as_stored(field: models.Field, model: type[models.Model], kind: type[models.Field]) -> models.Field:
    """The same field as the table has it, of class ``kind`` (an IntegerField for a 32-bit
    column, a _NarrowText for MariaDB's TEXT), for alter_field to widen to ``field``."""
    name, _path, args, kwargs = field.deconstruct()
    old = kind(*args, **kwargs)
    old.set_attributes_from_name(name)
    old.model = model
    return old


def _rebuild(schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], copied: list[str]) -> None:
    table = model._meta.db_table
    q = schema_editor.quote_name
    old = f"{table}__rust"
    schema_editor.execute(f"ALTER TABLE {q(table)} RENAME TO {q(old)}")
    schema_editor.create_model(model)
    cols = ", ".join(q(c) for c in copied)
    schema_editor.execute(f"INSERT INTO {q(table)} ({cols}) SELECT {cols} FROM {q(old)}")
    schema_editor.execute(f"DROP TABLE {q(old)}")

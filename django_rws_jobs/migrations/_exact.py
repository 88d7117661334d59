"""MariaDB/MySQL: a binary, no-pad collation for a compared column (migrations 0007, 0011 and 0015).
Not a migration: the loader skips modules whose name starts with an underscore."""


def exact_collation(connection) -> str:
    """The utf8mb4 collation that compares bytes and does not pad: MariaDB's and MySQL 8's names."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def alter(schema_editor, model, name: str, collate: bool) -> None:
    """Give ``model``'s column ``name`` the exact collation (``collate``), or take it back."""
    plain = model._meta.get_field(name)
    exact = plain.clone()
    exact.db_collation = exact_collation(schema_editor.connection)
    exact.set_attributes_from_name(name)
    exact.model = model
    old, new = (plain, exact) if collate else (exact, plain)
    schema_editor.alter_field(model, old, new)


def alter_columns(apps, schema_editor, columns: dict[str, list[str]], collate: bool) -> None:
    """``alter`` for each of ``columns`` (model name -> field names), on MariaDB/MySQL only."""
    if schema_editor.connection.vendor != "mysql":
        return
    for model_name, names in columns.items():
        model = apps.get_model("django_rws_jobs", model_name)
        for name in names:
            alter(schema_editor, model, name, collate)


def collate(columns: dict[str, list[str]]):
    """The operation that gives ``columns`` (model name -> field names) the exact collation on
    MariaDB/MySQL, and takes it back when the migration is unapplied. Not atomic: Django refuses
    DDL inside a transaction there."""
    from django.db import migrations

    def forwards(apps, schema_editor):
        alter_columns(apps, schema_editor, columns, True)

    def backwards(apps, schema_editor):
        alter_columns(apps, schema_editor, columns, False)

    return migrations.RunPython(forwards, backwards, atomic=False, elidable=False)

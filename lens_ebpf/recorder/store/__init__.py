"""The recorder's database: its tables (schema), their migrations, the one writer, and the
query functions named for the questions they answer."""

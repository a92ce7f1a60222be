from django.apps import AppConfig


class FilesConfig(AppConfig):
    """Issue 29 (X1): a person's files, stored once, their text extracted by the worker (R4), sent by reference."""

    name = "files"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: the job reads models, which exist only once the registry is ready.
        from conversations import outbox
        from files import embedding, services

        outbox.register("extract", services.extract_job)
        outbox.register("drop_unsent", services.drop_unsent_job)
        outbox.register("embed_file", embedding.embed_file_job)
        outbox.register_sweep("embed-files", embedding.backfill, every_seconds=600)

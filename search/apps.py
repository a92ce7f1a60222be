from django.apps import AppConfig


class SearchConfig(AppConfig):
    name = "search"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: they import models, which exist only once the registry is ready.
        from conversations import outbox
        from conversations.turns.retrieval import register_retriever
        from search import embedding
        from search import jobs as search_jobs
        from search.retrieval import find_hits

        outbox.register("index", search_jobs.run, after_turn=True)
        outbox.register("embed", embedding.run, after_turn=True)
        outbox.register_sweep("embed-backfill", embedding.backfill, every_seconds=600)
        outbox.register_sweep("index-given-up", search_jobs.run_given_up, every_seconds=600)
        register_retriever(find_hits)

"""A turn: where it starts (start), the one runner (runner), the one node recorder (records), open calls and
approvals (calls), its events and outcome (events), what the model saw (seen), its events to async readers
(streaming)."""

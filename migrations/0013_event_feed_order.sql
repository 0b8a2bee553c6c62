-- The public feed without a deployment-wide lock: it is ordered by (feed_xid, id), where
-- feed_xid is the id of the transaction that wrote the event (or its subject's previous
-- event's, when greater), and readers deliver only events below the oldest running
-- transaction (see src/store/events.rs). The events already stored get this migration's
-- transaction id, so ordering by id inside it keeps their order.
ALTER TABLE run_events ADD COLUMN feed_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
-- Only `events::append` writes events, and it sets feed_xid itself: an insert that does
-- not is refused instead of taking a position that could break a run's order in the feed.
ALTER TABLE run_events ALTER COLUMN feed_xid DROP DEFAULT;
-- The scoped public feed: one workspace's events in feed order.
DROP INDEX run_events_feed;
CREATE INDEX run_events_feed ON run_events (workspace_id, feed_xid, id);

-- Search ranks the newest matches of a query (store::search::RANKED_WINDOW):
-- for a word most documents hold, walking this index backwards finds them
-- without reading every match.
CREATE INDEX search_docs_recent ON search_docs (seq DESC);

-- A poll page commit in one flight (docs/design/connector-contract.md, "The poll tick").
--
-- The page commit sends its fenced cursor update, the next tick's claim, the page's receipts
-- and its COMMIT together. The fence must therefore stop the transaction on the server: when
-- the cursor update finds the lease no longer held with the poller's token, this function
-- raises, the transaction aborts, and nothing sent with it (receipts, next claim) is written.
-- Its SQLSTATE is the poller's signal that the lease was lost.

CREATE FUNCTION connector_poll_lease_lost(detail text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION '%', detail USING ERRCODE = 'NXL01';
END
$$;

-- Every process caches content lookups until the catalog changes: a change that could make a
-- cached answer stale (UPDATE, DELETE, TRUNCATE, and the UPDATE arm of an upsert) notifies
-- channel arkvory_catalog at commit, whoever made it (the writer or an operator's SQL).
CREATE FUNCTION arkvory_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('arkvory_catalog', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER arkvory_repositories_changed AFTER UPDATE OR DELETE OR TRUNCATE ON arkvory_repositories
    FOR EACH STATEMENT EXECUTE FUNCTION arkvory_catalog_changed();
CREATE TRIGGER arkvory_artifacts_changed AFTER UPDATE OR DELETE OR TRUNCATE ON arkvory_artifacts
    FOR EACH STATEMENT EXECUTE FUNCTION arkvory_catalog_changed();
CREATE TRIGGER arkvory_packages_changed AFTER UPDATE OR DELETE OR TRUNCATE ON arkvory_packages
    FOR EACH STATEMENT EXECUTE FUNCTION arkvory_catalog_changed();
CREATE TRIGGER arkvory_assets_changed AFTER UPDATE OR DELETE OR TRUNCATE ON arkvory_assets
    FOR EACH STATEMENT EXECUTE FUNCTION arkvory_catalog_changed();

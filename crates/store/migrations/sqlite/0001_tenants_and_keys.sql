-- Tenants and their API keys (SQLite). Same logical schema as ../postgres: times are Unix
-- seconds, `allowed_models` is a JSON array of model names (NULL: every model), a key is kept
-- only as the SHA-256 digest of its secret.

CREATE TABLE tenants (
    name             TEXT    NOT NULL PRIMARY KEY,
    requests_per_min INTEGER,
    tokens_per_min   INTEGER,
    max_concurrency  INTEGER,
    priority         TEXT    NOT NULL DEFAULT 'standard'
                             CHECK (priority IN ('critical', 'standard', 'batch')),
    allowed_models   TEXT,
    pool             TEXT,
    enabled          BOOLEAN NOT NULL DEFAULT 1,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT    NOT NULL PRIMARY KEY,
    tenant      TEXT    NOT NULL REFERENCES tenants (name),
    digest      BLOB    NOT NULL CHECK (length(digest) = 32),
    prefix      TEXT    NOT NULL,
    description TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    revoked_at  INTEGER
);

-- Every authentication miss in the cache is one lookup by digest; cache warming pages by it.
CREATE UNIQUE INDEX api_keys_digest ON api_keys (digest);
CREATE INDEX api_keys_tenant ON api_keys (tenant);

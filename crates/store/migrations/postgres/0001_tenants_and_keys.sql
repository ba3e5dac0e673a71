-- Tenants and their API keys (PostgreSQL). Same logical schema as ../sqlite: times are Unix
-- seconds, `allowed_models` is a JSON array of model names (NULL: every model), a key is kept
-- only as the SHA-256 digest of its secret. Integers are BIGINT so both backends decode i64.

CREATE TABLE tenants (
    name             TEXT    NOT NULL PRIMARY KEY,
    requests_per_min BIGINT,
    tokens_per_min   BIGINT,
    max_concurrency  BIGINT,
    priority         TEXT    NOT NULL DEFAULT 'standard'
                             CHECK (priority IN ('critical', 'standard', 'batch')),
    allowed_models   TEXT,
    pool             TEXT,
    enabled          BOOLEAN NOT NULL DEFAULT TRUE,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT   NOT NULL PRIMARY KEY,
    tenant      TEXT   NOT NULL REFERENCES tenants (name),
    digest      BYTEA  NOT NULL CHECK (octet_length(digest) = 32),
    prefix      TEXT   NOT NULL,
    description TEXT,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
);

-- Every authentication miss in the cache is one lookup by digest; cache warming pages by it.
CREATE UNIQUE INDEX api_keys_digest ON api_keys (digest);
CREATE INDEX api_keys_tenant ON api_keys (tenant);

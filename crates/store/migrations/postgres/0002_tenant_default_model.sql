-- The model a request that names none goes to, where its API allows leaving it out (a Responses
-- API create). NULL: none, such a request is refused.
ALTER TABLE tenants ADD COLUMN default_model TEXT;

"""The PostgreSQL control plane shared by all domains: pool, migrations, fenced leases."""

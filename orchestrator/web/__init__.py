"""What the two web faces share: a request's database session and settings (`deps`), and the API token
check (`guard`). The REST API (`api/`) and the dashboard (`dashboard/`) both import it; it imports neither,
and no domain part.
"""

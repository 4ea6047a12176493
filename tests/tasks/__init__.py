"""Small tasks shipped with the tests (gymnasium environments with test-sized budgets)."""

"""`specgen bench`: the plan of what runs, the side-by-side runs, and the floors they are measured
against."""

"""The "Overview" page of the admin: what runs now, what failed, is late or needs attention,
each schedule's last runs and next fires, and the start lag and throughput over time, drawn
as server-rendered SVG.

``sections`` reads (a constant number of queries), ``charts`` and ``strips`` draw, ``view``
checks permissions and renders the template.
"""

from django_periodic.admin.overview.view import overview_view

__all__ = ["overview_view"]

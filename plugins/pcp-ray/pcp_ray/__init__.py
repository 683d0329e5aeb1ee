"""`pcp launch ray`: a PCP run on a Ray cluster, its shepherd and workers as Ray actors.

The launcher (`pcp_ray.launcher`) writes the run's plan into the run directory; the
driver (`pcp_ray.driver`) joins the cluster, places one actor for the shepherd and one
per worker by Ray's resources, and waits for the run; each actor runs the real `pcp
shepherd` or `pcp worker` (`pcp_ray.actors`). A worker actor that dies is restarted by
Ray and its worker rejoins the run. Ray is imported only by the driver and the actors.
"""

from pcp_core import hookimpl

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


@hookimpl
def pcp_register_launchers(register) -> None:
    from pcp_ray.launcher import RAY  # here: keeps `pcp --help` fast

    register(RAY)

"""Imported by ``rws_worker --pool processes``'s fork server when it starts: sets Django up once,
so that each child it forks starts with the settings, apps and handlers loaded. Outside the worker
package, which needs Django set up to import. (Importing it anywhere else sets Django up too,
which only a process of its own may do.)"""

import django

django.setup()

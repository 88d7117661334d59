# settings.py, on Django 5.2 and 6.0: the worker prints each email instead of handing it to an SMTP
# server on localhost (the default), as Django 6.1's startproject has it (MAILERS)
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

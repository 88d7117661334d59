from django.contrib import admin

from .models import Import, Order, Product

admin.site.register(Order)
admin.site.register(Product)
admin.site.register(Import)
